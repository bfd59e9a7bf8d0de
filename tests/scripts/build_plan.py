"""Build a run in one process (world 1) and say whether `cfg` came out of `build()` as it went in, and what the plan
decided (tests/e2e/test_build_plan.py). `unpacked`: the packing check is made to fail, so packing is turned off.

    python tests/scripts/build_plan.py RUN_DIR [unpacked] -- FLAG ...
"""

import contextlib
import copy
import dataclasses
import json
import sys

from nanosky.cli import parse_args
from nanosky.train import packing

if __name__ == "__main__":
    run_dir, mode = sys.argv[1], sys.argv[2]
    flags = sys.argv[sys.argv.index("--") + 1 :]
    if mode == "unpacked":

        def differs(model, forward, tol):
            raise packing.PackingUnsupported("packed and unpacked forwards differ by 0.5 (> 0.0001) (forced)")

        packing.verify = differs
    cfg = parse_args([*flags, "--log.run-dir", run_dir], console=False)
    cfg.finalize()  # what train() does before build
    before = copy.deepcopy(cfg)
    from nanosky import trainer

    with contextlib.ExitStack() as resources:
        run = trainer.build(cfg, resources)
        print("RESULT " + json.dumps({"same": cfg == before, "plan": dataclasses.asdict(run.plan)}), flush=True)
