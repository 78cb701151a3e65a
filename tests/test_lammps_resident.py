"""The resident path of ``pair_style nvalchemi`` (the one a model on a GPU takes), on the CPU.

On a GPU the pair style sends the neighbor list's candidate pairs only when LAMMPS rebuilds
the list and positions every step; the model builds rij, applies the cutoff, and returns
per-atom forces (per-pair ones when a per-atom virial is wanted); ghost exchanges follow
the pair style's exchange plan (gathers on the device, only rows of remote atoms between
ranks). The driver forces that
path on the CPU by setting the session's ``on_device``, so an MD run with list rebuilds,
thermo steps, a second run (its setup sorts atoms and moves them between ranks, often
without changing their count) and ``compute stress/atom`` can be compared with the host path run for run.
"""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from nvalchemi_lammps.lammps_run import lammps_command, run_command

pytestmark = pytest.mark.lammps

DRIVER = textwrap.dedent(
    """\
    import sys

    import numpy as np

    import lammps
    import nvalchemi_lammps.frontends.plugin as frontend

    data, model, resident, out = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    init = frontend.PluginSession.__init__


    def forced(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.on_device = resident


    frontend.PluginSession.__init__ = forced
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    lmp.commands_string(f'''
        units metal
        atom_style atomic
        atom_modify map array
        read_data {data}
        pair_style nvalchemi {model}
        pair_coeff * * Ar
        neighbor 1.0 bin
        neigh_modify every 5 delay 0 check no
        compute sa all stress/atom NULL
        compute sasum all reduce sum c_sa[1] c_sa[2] c_sa[3] c_sa[4] c_sa[5] c_sa[6]
        thermo_style custom step pe press c_sasum[1] c_sasum[4]
        thermo 4
        fix nve all nve
        timestep 0.002
        run 6
        atom_modify sort 5 2.0
        run 7
    ''')
    forces = np.array(lmp.gather_atoms("f", 1, 3), dtype=np.float64).reshape(-1, 3)
    thermo = [lmp.get_thermo(k) for k in ("pe", "press")]
    lmp.command("run 0")  # a thermo step: per-atom virial wanted, per-pair forces back
    stress = np.array(lmp.gather("c_sa", 1, 6), dtype=np.float64).reshape(-1, 6)
    if lmp.extract_setting("world_rank") == 0:
        np.savez(out, forces=forces, thermo=np.array(thermo), stress=stress)
    lmp.close()
    lmp.finalize()
    """
)


@pytest.fixture(scope="module")
def message_passing(tmp_path_factory):
    from nvalchemi_lammps import MessagePassing, save_model

    path = tmp_path_factory.mktemp("resident") / "mp.pt"
    return save_model(MessagePassing(["Ar"], cutoff=5.0, layers=3, features=8, seed=3), path)


def _run(tmp_path, data, model, nprocs: int, resident: bool) -> dict[str, np.ndarray]:
    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / f"np{nprocs}_{int(resident)}.npz"
    cmd = lammps_command(nprocs)[:-1] + [
        sys.executable,
        "driver.py",
        str(data),
        str(model),
        str(int(resident)),
        str(out),
    ]
    run_command(cmd, tmp_path, timeout=600).check()
    return dict(np.load(out))


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_resident_path_equals_host_path(argon_data, message_passing, tmp_path, nprocs):
    host = _run(tmp_path, argon_data, message_passing, nprocs, resident=False)
    resident = _run(tmp_path, argon_data, message_passing, nprocs, resident=True)
    for name in ("forces", "thermo", "stress"):
        scale = np.abs(host[name]).max()
        assert np.abs(resident[name] - host[name]).max() <= 1e-10 * scale, name
    # and the ranks agree with one rank (where the plan sends nothing)
    if nprocs > 1:
        one = _run(tmp_path, argon_data, message_passing, 1, resident=True)
        for name in ("forces", "thermo", "stress"):
            scale = np.abs(one[name]).max()
            assert np.abs(resident[name] - one[name]).max() <= 1e-10 * scale, name
