"""When each job of a Snakemake run started and ended, in seconds from the run's first job, from
its log: the README's timeline tables of the local profile come from this, and which jobs ran
beside which says what waited for what. python -m dev.timeline results/records/h200-local/snakemake.log"""

from __future__ import annotations

import datetime
import re
import sys
from dataclasses import dataclass

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?rule (\w+):$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")


@dataclass
class Job:
    rule: str
    jobid: int
    wildcards: str
    start: float
    end: float | None = None

    @property
    def name(self) -> str:
        return f"{self.rule} ({self.wildcards})" if self.wildcards else self.rule


def jobs(lines: list[str]) -> list[Job]:
    """The log's jobs in the order they started; `end` None for one that never finished."""
    found: dict[int, Job] = {}
    t0 = now = None
    pending: dict | None = None  # the rule block being read: its name, then jobid and wildcards

    def close():
        if pending and "jobid" in pending:
            found[pending["jobid"]] = Job(pending["rule"], pending["jobid"], pending.get("wildcards", ""),
                                          pending["start"])

    for line in lines:
        line = line.rstrip("\n")
        if m := STAMP.match(line):
            now = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            t0 = t0 or now
            continue
        if now is None:
            continue
        if m := RULE.match(line):
            close()
            pending = {"rule": m.group(1), "start": (now - t0).total_seconds()}
        elif pending and (m := JOBID.match(line)):
            pending["jobid"] = int(m.group(1))
        elif pending and (m := WILDCARDS.match(line)):
            pending["wildcards"] = m.group(1).strip()
        elif m := FINISHED.match(line):
            close()
            pending = None
            job = found.get(int(m.group(1)))
            if job is not None:
                job.end = (now - t0).total_seconds()
        elif not line.startswith(" "):
            close()
            pending = None
    close()
    return sorted(found.values(), key=lambda j: (j.start, j.jobid))


def table(found: list[Job]) -> str:
    rows = ["| job | start | end | seconds |", "|---|---|---|---|"]
    for j in found:
        end = "-" if j.end is None else f"{j.end:.0f}"
        took = "-" if j.end is None else f"{j.end - j.start:.0f}"
        rows.append(f"| {j.name} | {j.start:.0f} | {end} | {took} |")
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit(__doc__)
    with open(argv[0]) as f:
        print(table(jobs(f.readlines())))


if __name__ == "__main__":
    main(sys.argv[1:])
