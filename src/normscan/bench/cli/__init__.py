"""The `normscan` command: bench (the main job), verify, env, build, export-kernelbench."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from . import bench, build, env, export, verify

COMMANDS = {
    "bench": (bench, "check and time every op against eager, torch.compile and copy bandwidth"),
    "verify": (verify, "strict correctness sweep against float64 references"),
    "env": (env, "versions, device, source commit, cache folder, build state"),
    "build": (build, "compile the ops' kernels now, side by side, instead of on their first calls"),
    "export-kernelbench": (export, "write self-contained KernelBench solution files"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normscan", description="Fused CUDA normalisation and scan kernels.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="normscan: %(message)s")
    try:
        code = COMMANDS[args.command][0].main(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`normscan ... | head`): end quietly, with the status of a
        # program stopped by SIGPIPE, as other Unix tools do; and keep the interpreter's own
        # flush at exit from failing on the closed pipe too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
