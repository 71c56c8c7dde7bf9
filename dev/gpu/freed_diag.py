"""Which cycle keeps the first ablation run on the GPU: its garbage's frames, after a del with gc off."""
import collections, dataclasses, gc, sys, tempfile, types, weakref
from pathlib import Path
sys.path.insert(0, "tests")
from configured import ablate_settings
from tiny_setup import tiny_setup
from ratchet.mismatch.ablation import Trajectory
settings = ablate_settings(updates=(0,), num_rollouts=4, max_new_tokens=4, problems_per_step=2, group_size=4,
                           lr=1e-6, engine_dtypes=("fp16",), seed=0, engine_dtype="fp16", micro_batch_size=4,
                           fix_steps=1, fix_runs=("exact",))
setup = dataclasses.replace(tiny_setup(Path(tempfile.mkdtemp()), num_measure=4), backend="cuda", device="cuda")
gc.collect(); gc.disable()
traj = Trajectory(setup, settings.grpo("exact"))
traj.train_step()
r = weakref.ref(traj)
del traj
print("freed", r() is None)
gc.set_debug(gc.DEBUG_SAVEALL); gc.collect()
print(collections.Counter(type(o).__name__ for o in gc.garbage).most_common(30))
for o in gc.garbage:
    if isinstance(o, types.FrameType):
        print("frame", o.f_code.co_filename, o.f_code.co_name, o.f_lineno)
    if isinstance(o, BaseException):
        print("exc", repr(o)[:300])
