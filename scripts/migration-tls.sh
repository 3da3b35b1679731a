#!/bin/sh
# Makes a --tls-dir for migrating between machines (`vmlauncher run --tls-dir DIR`): two sets,
# each a CA with a server certificate naming every HOST given (DNS names or IP addresses: what
# sources dial) and a client certificate, in QEMU's file names:
#   DIR/*.pem       the launchers' (their API over TCP, libvirtd's TLS listener): root reads them
#   DIR/qemu/*.pem  QEMU's (the memory and disk streams), from a CA of its own: QEMU's user reads
#                   its key, and must not be able to open a launcher's API or a libvirtd with it
# Every launcher of the migration gets the same DIR (or, in production, certificates of its own
# from the same two CAs).
#
#   scripts/migration-tls.sh DIR HOST [HOST...]
#
# For trying the TCP form and for the tests; a cluster's own CA (cert-manager, a PKI) does better.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 DIR HOST [HOST...]" >&2; exit 2; }
dir=$1; shift
umask 077
san=""
for host in "$@"; do
    case $host in
        \[*\]) host=${host#\[}; host=${host%\]}; kind=IP ;;
        *:*) kind=IP ;;
        *[!0-9.]*) kind=DNS ;;
        *) kind=IP ;;
    esac
    san="${san:+$san,}$kind:$host"
done

# make_set DIR WHOSE: a CA and its server and client certificates in DIR.
make_set() {
    mkdir -p "$1"
    (
        cd "$1"
        cat > ext.cnf <<CNF
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
CNF
        key() { openssl genpkey -quiet -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1"; }
        key ca-key.pem
        openssl req -x509 -new -key ca-key.pem -subj "/CN=vmlauncher $2 migration CA" \
            -days 3650 -extensions ca -config ext.cnf -out ca-cert.pem 2>/dev/null
        for role in server client; do
            key $role-key.pem
            openssl req -new -key $role-key.pem -subj "/CN=vmlauncher $2 $role" \
                -out $role.csr 2>/dev/null
            openssl x509 -req -in $role.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
                -days 3650 -extfile ext.cnf -extensions $role -out $role-cert.pem 2>/dev/null
            rm $role.csr
        done
        # The CA's key signs nothing more here: kept out of the directory launchers read.
        rm -f ext.cnf ca-cert.srl ca-key.pem
    )
}
make_set "$dir" launchers
make_set "$dir/qemu" QEMU
