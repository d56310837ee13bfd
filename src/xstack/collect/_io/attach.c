/* Attach mode: reach the wrappers without LD_PRELOAD by rewriting the GOT entries (JUMP_SLOT and GLOB_DAT
 * relocations) of every loaded object that point at the real functions, and put them back on detach.
 *
 * The executable and every shared object are patched except libc and the dynamic loader (their internal
 * calls are not the program's I/O) and this library. Pages under RELRO are made writable for the write and
 * read-only again, mirroring the range glibc protected. Only slots that hold the real function (or, with
 * lazy binding, still point into the object's own PLT) are patched: an object that defines its own `read`
 * keeps it. Objects loaded later are patched by the dlopen wrapper (hooks_proc.c) through
 * xio_attach_rescan. Detach restores only slots of objects still loaded and still holding our wrapper.
 */
#include "xio.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#define XIO_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define XIO_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define XIO_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define XIO_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#if __ELF_NATIVE_CLASS == 64
#define XIO_R_TYPE ELF64_R_TYPE
#define XIO_R_SYM ELF64_R_SYM
#else
#define XIO_R_TYPE ELF32_R_TYPE
#define XIO_R_SYM ELF32_R_SYM
#endif

#define MAX_PATCHES 65536
#define MAX_SEEN 8192

struct patch {
    void **slot;
    void *old;
    void *wrapper;
    int relro;
};

struct object {
    uintptr_t base;
    const ElfW(Phdr) * phdr;
    int phnum;
    uintptr_t relro_start, relro_end;
};

static struct patch *patches;
static size_t npatches;
static uintptr_t seen[MAX_SEEN];
static size_t nseen;
static unsigned long long last_subs;
static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;
static int patch_overflow;

int xio_attach_supported(void)
{
#ifdef XIO_R_JUMP_SLOT
    return 1;
#else
    return 0;
#endif
}

#ifdef XIO_R_JUMP_SLOT

static const struct xio_hook *find_hook(const char *name)
{
    static const struct xio_hook *const tables[] = {xio_hooks_posix, xio_hooks_stat, xio_hooks_stdio, xio_hooks_dir,
                                                    xio_hooks_proc, xio_hooks_attach_only};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (const struct xio_hook *h = tables[t]; h->name; h++)
            if (h->name[0] == name[0] && strcmp(h->name, name) == 0)
                return h;
    return NULL;
}

static int in_object(const struct object *o, uintptr_t addr)
{
    for (int i = 0; i < o->phnum; i++) {
        const ElfW(Phdr) *p = &o->phdr[i];
        if (p->p_type == PT_LOAD && addr >= o->base + p->p_vaddr && addr < o->base + p->p_vaddr + p->p_memsz)
            return 1;
    }
    return 0;
}

static int write_slot(void **slot, void *value, int relro)
{
    uintptr_t page = (uintptr_t)slot & ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
    size_t len = (size_t)sysconf(_SC_PAGESIZE);
    if (relro && mprotect((void *)page, len, PROT_READ | PROT_WRITE) != 0)
        return -1;
    __atomic_store_n(slot, value, __ATOMIC_SEQ_CST);
    if (relro)
        mprotect((void *)page, len, PROT_READ);
    return 0;
}

static void patch_relocs(const struct object *o, const ElfW(Rela) * rel, size_t bytes, const ElfW(Sym) * symtab,
                         const char *strtab)
{
    for (size_t i = 0; rel && i < bytes / sizeof *rel; i++) {
        unsigned long type = XIO_R_TYPE(rel[i].r_info);
        if (type != XIO_R_JUMP_SLOT && type != XIO_R_GLOB_DAT)
            continue;
        const ElfW(Sym) *sym = &symtab[XIO_R_SYM(rel[i].r_info)];
        const struct xio_hook *h = find_hook(strtab + sym->st_name);
        if (!h)
            continue;
        void **slot = (void **)(o->base + rel[i].r_offset);
        void *cur = *slot;
        if (cur == h->wrapper || (cur != *h->real && !(type == XIO_R_JUMP_SLOT && in_object(o, (uintptr_t)cur))))
            continue;
        if (npatches == MAX_PATCHES) {
            patch_overflow = 1;
            return;
        }
        int relro = (uintptr_t)slot >= o->relro_start && (uintptr_t)slot < o->relro_end;
        if (write_slot(slot, h->wrapper, relro) == 0)
            patches[npatches++] = (struct patch){slot, cur, h->wrapper, relro};
    }
}

static uintptr_t dyn_ptr(const struct object *o, ElfW(Addr) p)
{
    /* glibc relocates most dynamic entries in place; the vDSO's and some arches' stay relative */
    return p < o->base ? o->base + p : p;
}

static void patch_object(const struct object *o, const ElfW(Dyn) * dyn)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmpsz = 0, relasz = 0;
    long pltrel = DT_RELA;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = (const void *)dyn_ptr(o, dyn->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const void *)dyn_ptr(o, dyn->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const void *)dyn_ptr(o, dyn->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmpsz = dyn->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)dyn->d_un.d_val; break;
        case DT_RELA: rela = (const void *)dyn_ptr(o, dyn->d_un.d_ptr); break;
        case DT_RELASZ: relasz = dyn->d_un.d_val; break;
        default: break;
        }
    }
    if (!symtab || !strtab)
        return;
    if (pltrel == DT_RELA)
        patch_relocs(o, jmprel, jmpsz, symtab, strtab);
    patch_relocs(o, rela, relasz, symtab, strtab);
}

static int skipped_object(const struct dl_phdr_info *info, const struct object *o)
{
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libc.so", 7) == 0 || strncmp(base, "ld-linux", 8) == 0 || strncmp(base, "ld64.so", 7) == 0 ||
        strncmp(base, "linux-vdso", 10) == 0 || strncmp(base, "linux-gate", 10) == 0)
        return 1;
    return in_object(o, (uintptr_t)xio_attach_supported); /* ourselves */
}

static void object_of(const struct dl_phdr_info *info, struct object *o, const ElfW(Dyn) * *dyn)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    *o = (struct object){.base = info->dlpi_addr, .phdr = info->dlpi_phdr, .phnum = info->dlpi_phnum};
    *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type == PT_DYNAMIC)
            *dyn = (const void *)(info->dlpi_addr + p->p_vaddr);
        else if (p->p_type == PT_GNU_RELRO) {
            o->relro_start = (info->dlpi_addr + p->p_vaddr) & ~(page - 1);
            o->relro_end = (info->dlpi_addr + p->p_vaddr + p->p_memsz) & ~(page - 1);
        }
    }
}

static int patch_callback(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    if (info->dlpi_subs != last_subs) {
        nseen = 0; /* objects went away: their addresses may now hold others */
        last_subs = info->dlpi_subs;
    }
    for (size_t i = 0; i < nseen; i++)
        if (seen[i] == info->dlpi_addr)
            return 0;
    struct object o;
    const ElfW(Dyn) *dyn;
    object_of(info, &o, &dyn);
    if (dyn && !skipped_object(info, &o))
        patch_object(&o, dyn);
    if (nseen < MAX_SEEN)
        seen[nseen++] = info->dlpi_addr;
    return 0;
}

static int unpatch_callback(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    struct object o;
    const ElfW(Dyn) *dyn;
    object_of(info, &o, &dyn);
    for (size_t i = 0; i < npatches; i++) {
        struct patch *p = &patches[i];
        if (p->slot && in_object(&o, (uintptr_t)p->slot)) {
            if (*p->slot == p->wrapper)
                write_slot(p->slot, p->old, p->relro);
            p->slot = NULL;
        }
    }
    return 0;
}

int xio_attach_patch(char *err, size_t errlen)
{
    pthread_mutex_lock(&patch_lock);
    if (!patches)
        patches = xio_sys_mmap(MAX_PATCHES * sizeof *patches);
    int rc = 0;
    if (!patches) {
        strncpy(err, "cannot allocate the patch table (mmap failed)", errlen - 1);
        rc = -1;
    } else {
        nseen = 0;
        last_subs = 0;
        patch_overflow = 0;
        dl_iterate_phdr(patch_callback, NULL);
        if (npatches == 0) {
            strncpy(err, "no loaded object calls the interposed functions through its GOT", errlen - 1);
            rc = -1;
        }
    }
    pthread_mutex_unlock(&patch_lock);
    return rc;
}

void xio_attach_rescan(void)
{
    pthread_mutex_lock(&patch_lock);
    if (patches && xio.mode == XIO_MODE_ATTACH)
        dl_iterate_phdr(patch_callback, NULL);
    pthread_mutex_unlock(&patch_lock);
}

void xio_attach_unpatch(void)
{
    pthread_mutex_lock(&patch_lock);
    if (patches)
        dl_iterate_phdr(unpatch_callback, NULL);
    npatches = 0;
    nseen = 0;
    pthread_mutex_unlock(&patch_lock);
}

/* How many GOT entries point at our wrappers now (tests check that detach restores every one). */
static int patched_impl(void)
{
    pthread_mutex_lock(&patch_lock);
    int n = (int)npatches;
    pthread_mutex_unlock(&patch_lock);
    return n;
}

#else /* no GOT patching on this architecture */

static int patched_impl(void) { return 0; }

int xio_attach_patch(char *err, size_t errlen)
{
    strncpy(err, "attach mode is not supported on this architecture", errlen - 1);
    return -1;
}
void xio_attach_rescan(void) {}
void xio_attach_unpatch(void) {}

#endif

XIO_EXPORT int xstack_io_patched(void) __attribute__((alias("patched_impl")));
