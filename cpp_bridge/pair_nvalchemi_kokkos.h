/* -*- c++ -*- ----------------------------------------------------------
   nvalchemi-lammps: pair_style nvalchemi/kk, the KOKKOS variant of
   pair_style nvalchemi. The pairs within the cutoff are taken from the KOKKOS
   neighbor list by Kokkos kernels each step and go to torch with positions
   and atom IDs as DLPack views (no copy), the model's forces are added into
   LAMMPS's device force array, and ghost features move through KOKKOS's pair
   communication on device buffers.
------------------------------------------------------------------------- */

#ifdef PAIR_CLASS
// clang-format off
PairStyle(nvalchemi/kk,PairNvalchemiKokkos<LMPDeviceType>);
PairStyle(nvalchemi/kk/device,PairNvalchemiKokkos<LMPDeviceType>);
PairStyle(nvalchemi/kk/host,PairNvalchemiKokkos<LMPHostType>);
// clang-format on
#else

#ifndef LMP_PAIR_NVALCHEMI_KOKKOS_H
#define LMP_PAIR_NVALCHEMI_KOKKOS_H

#include "kokkos_base.h"
#include "kokkos_type.h"
#include "pair_kokkos.h"
#include "pair_nvalchemi.h"

namespace NvalchemiLammps {
struct DeviceResult;
}

namespace LAMMPS_NS {

template <class DeviceType> class PairNvalchemiKokkos : public PairNvalchemi, public KokkosBase {
 public:
  typedef DeviceType device_type;
  typedef ArrayTypes<DeviceType> AT;

  PairNvalchemiKokkos(class LAMMPS *);
  ~PairNvalchemiKokkos() override;

  void compute(int, int) override;
  void coeff(int, char **) override;
  void init_style() override;
  void finish() override;

  // this step's pairs within the cutoff into d_pair_i, d_pair_j, d_rij (and the sink's
  // buffers when they fit: their generation in sink_written, else -1); their number
  // (public: CUDA's extended lambdas need a public enclosing function)
  int64_t build_pairs(int nreceivers, int ntotal);
  int64_t sink_written = -1;
  // the exchange plan into d_owners, d_send_rows (exchange strategy; uses_plan())
  void build_plan(int nlocal, int ntotal);
  bool uses_plan() const;

  // ghost rows of a (nrows, width) float64 array in the execution space's memory take
  // their owners' rows (forward), or are summed into them and zeroed (reverse)
  void exchange_on_device(double *rows, int nrows, int width, bool forward);

  int pack_forward_comm_kokkos(int, DAT::tdual_int_1d, DAT::tdual_double_1d &, int,
                               int *) override;
  void unpack_forward_comm_kokkos(int, int, DAT::tdual_double_1d &) override;
  int pack_reverse_comm_kokkos(int, int, DAT::tdual_double_1d &) override;
  void unpack_reverse_comm_kokkos(int, DAT::tdual_int_1d, DAT::tdual_double_1d &) override;

  // what pair_virial_fdotr_compute reads
  typename AT::t_kkfloat_1d_3_lr x;
  typename AT::t_kkacc_1d_3 f;

 protected:
  DAT::tdual_int_1d k_map;    // LAMMPS type -> model element index, -1 for NULL
  // this step's pairs within the cutoff (build_pairs), kept for the next steps to reuse
  typedef Kokkos::View<int64_t *, DeviceType> t_index;
  typedef Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType> t_vectors;
  t_index d_species;    // model element per atom row, -1 for NULL
  t_index d_counts;     // per list row: its pairs, then the first of them
  t_index d_pair_i, d_pair_j;
  t_vectors d_rij;
  t_index d_owners, d_send_rows;  // build_plan(), kept until the next neighbor-list build
  // the captured model's own input buffers (one rank, ghosts folded into their owners),
  // which the model hands back after each step: build_pairs writes the step's pairs there
  // too, each neighbor as its owned row, when they fit (generation -1: none)
  typedef Kokkos::View<int64_t *, DeviceType, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      t_index_unmanaged;
  typedef Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType,
                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      t_vectors_unmanaged;
  struct Sink {
    t_index_unmanaged pair_i, pair_j, species;
    t_vectors_unmanaged rij;
    int64_t capacity = 0;    // pairs
    int nlocal = -1;         // the owned rows it was laid out for
    int64_t generation = -1;
  } sink;
  void set_sink(const NvalchemiLammps::DeviceResult &result);
  bigint plan_built = -1;         // neighbor->ncalls when they were built
  int plan_ntotal = -1;
  bool plan_exchange = true;      // NVALCHEMI_LAMMPS_EXCHANGE (init_style)
  bool exchange_reported = false;
  DAT::tdual_double_1d k_eatom;
  DAT::tdual_double_2d_lr k_vatom;
  // the rows being exchanged (exchange_width values per atom), in the execution space's
  // memory: a view of the model's tensor
  std::string model_device(const std::string &given) const override;
  std::vector<std::pair<std::string, std::string>> compared_settings() const override;

  typedef Kokkos::View<double *, Kokkos::LayoutRight, DeviceType,
                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      t_rows;
  t_rows d_rows;

  friend void pair_virial_fdotr_compute<PairNvalchemiKokkos>(PairNvalchemiKokkos *);
};

}    // namespace LAMMPS_NS

#endif
#endif
