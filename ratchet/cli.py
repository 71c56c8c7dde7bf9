"""`ratchet <stage> --config FILE [key=value ...]`: run one pipeline stage by hand.
The Snakemake rules call this same entry point, so a stage behaves the same in and out of it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ratchet import config as config_mod
from ratchet.stages import CONFIG_ENV, STAGES, run_stage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratchet", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=sorted(STAGES), help="pipeline stage to run")
    parser.add_argument("--config", help="YAML profile (default: config/config.yaml's defaults)")
    # the Snakemake rules pass the validated config through the environment (RATCHET_CONFIG_JSON)
    parser.add_argument("--config-from-env", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="override a config key, e.g. eval.num_problems=50")
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after --config
    try:
        if args.config_from_env:
            cfg = config_mod.validate(config_mod.apply_overrides(
                json.loads(os.environ[CONFIG_ENV]), args.overrides))
        else:
            cfg = config_mod.load(args.config, args.overrides)
    except config_mod.ConfigError as e:
        print(f"ratchet: {e}", file=sys.stderr)
        return 2
    run_stage(args.stage, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
