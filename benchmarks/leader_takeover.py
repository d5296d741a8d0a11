"""How long ElastiCo pods wait for a leader after the extender leader goes away.

Two electors (service/leader.py) campaign for one Lease on the fake API server over real
HTTP with the kubernetes client. The leader either crashes (stops renewing, keeps the
Lease) or stops cleanly (releases it); the table gives the time from that moment until
the follower leads, per scenario, over --trials runs. "bound" is the documented worst
case without API latency: leaseDurationSeconds (whole seconds on the wire) + retryPeriod
after a crash, retryPeriod after a clean stop.

    python benchmarks/leader_takeover.py                          # the chart's timings
    python benchmarks/leader_takeover.py --lease 1.5 --renew 1 --retry 0.1
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from _args import positive_float, positive_int
from kubernetes import client

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.service.leader import LeaderElector, LeaseTiming


def takeover(server: FakeApiServer, timing: LeaseTiming, crash: bool, trial: int) -> float:
    api = client.ApiClient(client.Configuration(host=server.url))
    name = f"bench-{crash}-{trial}"
    a = LeaderElector(api, name=name, namespace="ns", identity="a", timing=timing)
    b = LeaderElector(api, name=name, namespace="ns", identity="b", timing=timing)
    a.start()
    while not a.is_leader():
        time.sleep(0.01)
    b.start()
    time.sleep(2 * timing.retry_period)
    gone = time.monotonic()
    a.stop(release=not crash)
    while not b.is_leader():
        time.sleep(0.01)
    elapsed = time.monotonic() - gone
    b.stop()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lease", type=positive_float, default=15.0)
    p.add_argument("--renew", type=positive_float, default=10.0)
    p.add_argument("--retry", type=positive_float, default=2.0)
    p.add_argument("--trials", type=positive_int, default=3)
    args = p.parse_args()
    try:
        timing = LeaseTiming(args.lease, args.renew, args.retry)
    except ValueError as exc:
        p.error(f"--lease/--renew/--retry: {exc}")
    logging.basicConfig(level=logging.ERROR)  # the electors' own start/stop lines
    server = FakeApiServer().start()
    print(f"lease {args.lease:g} s, renew deadline {args.renew:g} s, retry {args.retry:g} s; "
          f"{args.trials} trials")  # fmt: skip
    print(f"{'leader':<14} {'bound (s)':>10} {'min':>7} {'median':>7} {'max':>7}")
    try:
        # leaseDurationSeconds is a whole number on the wire: the bound uses the rounded value
        lease = max(1, round(args.lease))
        for crash, bound in ((True, lease + args.retry), (False, args.retry)):
            times = [takeover(server, timing, crash, t) for t in range(args.trials)]
            label = "crashes" if crash else "stops cleanly"
            print(f"{label:<14} {bound:>10.2f} {min(times):>7.2f} "
                  f"{statistics.median(times):>7.2f} {max(times):>7.2f}")  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
