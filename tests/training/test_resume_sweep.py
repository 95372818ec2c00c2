"""Resume sweep: N steps + N steps == 2N straight, bit-exact.

For one tiny training config per resume path (at the smallest sizes that
still exercise its layers, through gin bindings), `terraformer.train` runs 3
steps into one directory and is called again for 6 (it resumes from the
checkpoint of step 3), against 6 steps straight in another directory. Evaluations
(every 3 steps, and at step 1) and checkpoints (every 2 steps, and at the
last step) fall on steps that do not divide evenly, so the resume step is
both a checkpoint and an eval step (the case that was inexact: Trax's Loop
saved before the eval drew its rngs). Every weight, state, optimizer-slot
array and the rng must be bit-identical, and so must the train losses and
eval metrics of steps 1, 3 and 6 (the next evaluation after the resume).

The cells, and how one is run and compared: tests/training/resume_cells.py.
FSDP over 4 devices and Trax's Loop over 2 processes run the sparse LM the
same way: tests/training/test_resume_sweep_devices.py. The runs share the
test session's persistent compilation cache (tests/conftest.py): a resumed
or straight run reads the programs the first run compiled.

Where else exact resume is checked: tests/training/test_loop.py (Trax's Loop
on a counting stream, the restored weights), tests/training/test_soak.py
(kill -9 while training), tests/training/test_distributed.py (2 processes
killed and restarted as Slurm tasks against 1 process of 4 devices, and FSDP
over 2 processes against Trax's Loop; within 1e-5, not bit-exact).
"""
import pytest

import resume_cells


@pytest.mark.parametrize('config', sorted(resume_cells.CELLS))
def test_resume_equals_straight(config, tmp_path):
  resume_cells.resume_equals_straight(config, resume_cells.CELLS[config],
                                      tmp_path)
