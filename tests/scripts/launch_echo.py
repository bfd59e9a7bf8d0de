"""Prints the resume command this process would print at a graceful stop (tests/e2e/test_startup_torchrun.py)."""

from nanosky import process
from nanosky.stop import resume_command

if __name__ == "__main__":
    process.record_launch()
    print("RESUME:", resume_command())
