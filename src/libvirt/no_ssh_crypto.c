/*
 * Preloaded into the private libvirtd (src/libvirt/lean.rs, `through_loader`): keeps its
 * start-up from setting up OpenSSL, which it never uses.
 *
 * libvirtd's virInitialize calls curl_global_init, which calls libssh2_init(0), which registers
 * every cipher, digest and engine of OpenSSL's libcrypto (seen with a gdb breakpoint on
 * OPENSSL_init_crypto). libssh2 sets its crypto up only on its first initialisation: called
 * first with LIBSSH2_INIT_NO_CRYPTO, as this constructor does before libvirtd's main runs, it
 * never does. libvirtd serves one launcher over a unix socket and speaks no SSH (it would for a
 * migration over qemu+libssh2://, which the launcher never asks for; with libssh2 on OpenSSL 3,
 * as on Debian, even that would work: OpenSSL sets itself up on first use). The launcher does
 * the same for itself
 * (src/libvirt/mod.rs). Measured on Debian 12 (the side-by-side bench, 16 disks): libvirtd RSS
 * 24.7 -> 23.1 MiB, PSS 14.3 -> 12.8 MiB, libcrypto's resident pages 2.9 -> 1.5 MiB.
 *
 * libssh2 is not linked here, only looked up among what libvirtd has loaded: where libvirt's
 * curl has no libssh2, this does nothing.
 */
#include <dlfcn.h>
#include <stddef.h>

#define LIBSSH2_INIT_NO_CRYPTO 0x0001

__attribute__((constructor)) static void libssh2_init_without_crypto(void)
{
    void *libssh2 = dlopen("libssh2.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (libssh2 == NULL)
        return;
    int (*init)(int) = (int (*)(int))dlsym(libssh2, "libssh2_init");
    if (init != NULL)
        init(LIBSSH2_INIT_NO_CRYPTO);
    dlclose(libssh2);
}
