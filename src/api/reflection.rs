//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), built on its first call.
//!
//! Building a reflection service decodes the descriptors of every file it lists into maps of
//! names: 77 KiB of heap for the pair (valgrind's massif, a held-still launcher), and the
//! protobuf decoding code's pages, held for the launcher's whole life. A node daemon calls the
//! Launcher service directly and never asks for reflection; grpcurl and Python's grpcio tools
//! do, and pay for it once, on the first call.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tonic::server::NamedService;
use tonic_reflection::server::{v1, v1alpha};

/// Both versions: grpcurl asks v1 first, Python's grpcio-reflection only knows v1alpha.
pub(super) fn services() -> (
    BuiltOnFirstCall<v1::ServerReflectionServer<impl v1::ServerReflection>>,
    BuiltOnFirstCall<v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>>,
) {
    (
        BuiltOnFirstCall::new(|| {
            builder()
                .build_v1()
                .expect("the embedded descriptor sets decode (tested)")
        }),
        BuiltOnFirstCall::new(|| {
            builder()
                .build_v1alpha()
                .expect("the embedded descriptor sets decode (tested)")
        }),
    )
}

fn builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(super::DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Each builder lists only its own version; both are served.
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// A service built by `build` when the first request reaches it, then shared by every clone
/// (tonic clones a service for each connection).
#[derive(Clone)]
pub(super) struct BuiltOnFirstCall<S> {
    service: Arc<OnceLock<S>>,
    build: fn() -> S,
}

impl<S> BuiltOnFirstCall<S> {
    fn new(build: fn() -> S) -> Self {
        Self {
            service: Arc::new(OnceLock::new()),
            build,
        }
    }
}

impl<S: NamedService> NamedService for BuiltOnFirstCall<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, R> tower::Service<R> for BuiltOnFirstCall<S>
where
    S: tower::Service<R> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Not built yet, so nothing to ask; tonic's generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.service.get_or_init(self.build).clone().call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_descriptor_sets_decode() {
        builder().build_v1().expect("v1");
        builder().build_v1alpha().expect("v1alpha");
    }

    #[tokio::test]
    async fn the_service_is_built_once_on_the_first_call_and_shared_by_clones() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static BUILT: AtomicUsize = AtomicUsize::new(0);
        let mut first = BuiltOnFirstCall::new(|| {
            BUILT.fetch_add(1, Ordering::SeqCst);
            tower::service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n + 1) })
        });
        let mut second = first.clone();
        assert_eq!(BUILT.load(Ordering::SeqCst), 0, "built before any call");
        assert_eq!(tower::Service::call(&mut first, 1).await, Ok(2));
        assert_eq!(tower::Service::call(&mut second, 41).await, Ok(42));
        assert_eq!(BUILT.load(Ordering::SeqCst), 1);
    }
}
