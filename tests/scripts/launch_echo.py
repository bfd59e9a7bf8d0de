"""Prints the resume command this process would print at a graceful stop (tests/e2e/test_startup_torchrun.py)."""

from nanosky import dist
from nanosky.stop import resume_command

if __name__ == "__main__":
    dist.record_launch()
    print("RESUME:", resume_command())
