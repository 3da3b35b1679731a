#!/usr/bin/env python3
"""A stock Python gRPC client of the launcher, as a node daemon written in Python would be.

Only PyPI's grpcio, grpcio-health-checking and grpcio-reflection, with DEFAULT channel options:
the channel is `unix:<socket>`, so gRPC's C core sends the percent-encoded socket path as
:authority. No generated code: the launcher's message types come from its reflection service.

Each sub-command (but health-watch) prints one JSON line on success and exits 0; on failure it prints the reason on
stderr and exits 1.

  health SOCKET [--service NAME]               grpc.health.v1 Check
  health-watch SOCKET --until STATUS           grpc.health.v1 Watch, one line per status, until STATUS
  services SOCKET                              the services reflection lists
  status SOCKET                                Launcher.GetStatus
  sync SOCKET SPEC_FILE [--block NAME=MAJ:MIN]... [--ready NAME]... [--gone NAME]...
                                               Launcher.Sync, then WatchEvents until every
                                               --ready volume is Ready and every --gone one removed
"""

import argparse
import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

LAUNCHER = "vmlauncher.v1.Launcher"
DEADLINE_S = 60


def channel(socket):
    # Default options on purpose: this is what a new user writes.
    return grpc.insecure_channel(f"unix:{socket}")


def launcher_types(ch):
    """Message classes of the Launcher service, from what the server's reflection serves."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(ch))
    service = pool.FindServiceByName(LAUNCHER)
    types = {}
    for method in service.methods:
        types[method.name] = (
            message_factory.GetMessageClass(method.input_type),
            message_factory.GetMessageClass(method.output_type),
        )
    return types


def unary(ch, types, method, request):
    request_type, response_type = types[method]
    call = ch.unary_unary(
        f"/{LAUNCHER}/{method}",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    return call(request, timeout=DEADLINE_S)


def events(ch, types):
    request_type, response_type = types["WatchEvents"]
    call = ch.unary_stream(
        f"/{LAUNCHER}/WatchEvents",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    return call(request_type(), timeout=DEADLINE_S)


def as_json(message):
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def cmd_health(args):
    with channel(args.socket) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=DEADLINE_S)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(json.dumps({"service": args.service, "status": status}))


def cmd_health_watch(args):
    """Prints every status the Watch stream sends, one JSON line each, as it comes."""
    with channel(args.socket) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        seen = []
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=args.service), timeout=DEADLINE_S)
        for reply in stream:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            seen.append(status)
            print(json.dumps({"service": args.service, "status": status}), flush=True)
            if status == args.until:
                stream.cancel()
                return
    raise SystemExit(f"health Watch ended before {args.until}; seen {seen}")


def cmd_services(args):
    with channel(args.socket) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        names = []
        for response in stub.ServerReflectionInfo(iter([request]), timeout=DEADLINE_S):
            names += [s.name for s in response.list_services_response.service]
        print(json.dumps({"services": sorted(names)}))


def cmd_status(args):
    with channel(args.socket) as ch:
        types = launcher_types(ch)
        print(json.dumps(as_json(unary(ch, types, "GetStatus", types["GetStatus"][0]()))))


def cmd_sync(args):
    with channel(args.socket) as ch:
        types = launcher_types(ch)
        request = types["Sync"][0]()
        with open(args.spec_file) as f:
            request.spec = f.read()
        for block in args.block:
            name, number = block.split("=", 1)
            major, minor = number.split(":", 1)
            device = request.block_devices[name]
            device.number.major = int(major)
            device.number.minor = int(minor)
        # Subscribe first, so no volume change can happen unseen.
        stream = events(ch, types)
        first = next(stream)
        reply = unary(ch, types, "Sync", request)
        want_ready, want_gone = set(args.ready), set(args.gone)
        ready, gone = {}, set()

        def look(volumes):
            for v in volumes:
                if v.name in want_ready and v.phase == v.PHASE_READY:
                    ready[v.name] = as_json(v)
                if v.name in want_ready and v.phase == v.PHASE_FAILED:
                    raise SystemExit(f"volume {v.name} failed: {v.reason}: {v.message}")

        look(first.resync.volumes)
        look(reply.volumes)
        names_now = {v.name for v in reply.volumes}
        gone |= {n for n in want_gone if n not in names_now}
        for event in stream:
            if set(ready) >= want_ready and gone >= want_gone:
                break
            kind = event.WhichOneof("kind")
            if kind == "volume":
                look([event.volume])
            elif kind == "volume_removed":
                gone.add(event.volume_removed)
            elif kind == "resync":
                look(event.resync.volumes)
        stream.cancel()
        if not (set(ready) >= want_ready and gone >= want_gone):
            raise SystemExit(f"events ended; ready {sorted(ready)}, gone {sorted(gone)}")
        print(json.dumps({"plan": [as_json(p) for p in reply.plan], "ready": ready,
                          "gone": sorted(gone)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("health")
    p.add_argument("socket")
    p.add_argument("--service", default="")
    p.set_defaults(run=cmd_health)
    p = sub.add_parser("health-watch")
    p.add_argument("socket")
    p.add_argument("--service", default="")
    p.add_argument("--until", required=True)
    p.set_defaults(run=cmd_health_watch)
    p = sub.add_parser("services")
    p.add_argument("socket")
    p.set_defaults(run=cmd_services)
    p = sub.add_parser("status")
    p.add_argument("socket")
    p.set_defaults(run=cmd_status)
    p = sub.add_parser("sync")
    p.add_argument("socket")
    p.add_argument("spec_file")
    p.add_argument("--block", action="append", default=[])
    p.add_argument("--ready", action="append", default=[])
    p.add_argument("--gone", action="append", default=[])
    p.set_defaults(run=cmd_sync)
    args = parser.parse_args()
    try:
        args.run(args)
    except grpc.RpcError as e:
        print(f"{args.command}: {e.code().name}: {e.details()}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
