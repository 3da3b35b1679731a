#!/bin/sh
# Makes a --tls-dir for migrating between machines (`vmlauncher run --tls-dir DIR`): a CA, a
# server certificate naming every HOST given (DNS names or IP addresses: what sources dial), and a
# client certificate, in QEMU's file names. Every launcher of the migration gets the same DIR
# (or, in production, certificates of its own from the same CA).
#
#   scripts/migration-tls.sh DIR HOST [HOST...]
#
# For trying the TCP form and for the tests; a cluster's own CA (cert-manager, a PKI) does better.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 DIR HOST [HOST...]" >&2; exit 2; }
dir=$1; shift
umask 077
mkdir -p "$dir"
cd "$dir"
san=""
for host in "$@"; do
    case $host in
        *[!0-9.]*) case $host in *:*) kind=IP ;; *) kind=DNS ;; esac ;;
        *) kind=IP ;;
    esac
    san="${san:+$san,}$kind:$host"
done
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
openssl req -x509 -new -key ca-key.pem -subj "/CN=vmlauncher migration CA" -days 3650 \
    -extensions ca -config ext.cnf -out ca-cert.pem 2>/dev/null
for role in server client; do
    key $role-key.pem
    openssl req -new -key $role-key.pem -subj "/CN=vmlauncher $role" -out $role.csr 2>/dev/null
    openssl x509 -req -in $role.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
        -days 3650 -extfile ext.cnf -extensions $role -out $role-cert.pem 2>/dev/null
    rm $role.csr
done
# The CA's key signs nothing more here: kept out of the directory launchers read.
rm -f ext.cnf ca-cert.srl ca-key.pem
