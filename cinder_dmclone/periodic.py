#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""The hydration monitor.

Each tick reads the status of every clone target on the node with ONE
``dmsetup status --target clone`` call, however many volumes are in
transfer, works out progress (hydrated/total, rate, ETA) and hands each
handle's status to a callback that decides what to do with it (the
transfer logic: finalize a finished clone, publish progress).  A failure
on one volume, in its callback or in the parse of its status line, is
logged and never stops the others.
"""

import dataclasses
import time

from oslo_log import log as logging
from oslo_service import loopingcall

from cinder_dmclone import layout

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Hydration progress of one clone as seen at one tick."""

    hydrated_regions: int
    total_regions: int
    region_bytes: int
    #: bytes per second since the previous tick, None on the first one.
    rate: float = None
    #: seconds to go at that rate, None when unknown.
    eta: float = None
    #: seconds since the hydrated count last grew while hydration was
    #: on and unfinished; 0 while it advances (see HydrationMonitor).
    stalled_seconds: float = 0.0

    @property
    def fraction(self):
        if not self.total_regions:
            return 1.0
        return self.hydrated_regions / self.total_regions

    @property
    def percent(self):
        return round(100.0 * self.fraction, 1)

    def as_dict(self):
        """A flat dict of strings, as admin metadata wants it."""
        return {
            'hydrated_regions': str(self.hydrated_regions),
            'total_regions': str(self.total_regions),
            'percent': '%.1f' % (100.0 * self.fraction),
            'rate_bps': '' if self.rate is None else '%d' % self.rate,
            'eta_seconds': '' if self.eta is None else '%d' % self.eta,
            'stalled_seconds': '%d' % self.stalled_seconds,
        }


def compute_progress(status, previous=None, elapsed=None, stalled=0.0):
    """Progress of a clone from its status and the previous sample.

    ``previous`` is the Progress of the last tick and ``elapsed`` the
    seconds since; the rate is the hydrated bytes between the two samples.
    ``stalled`` is carried as is (the monitor knows since when).
    """
    region_bytes = status.region_size * 512
    rate = eta = None
    if previous is not None and elapsed and elapsed > 0:
        done = status.hydrated_regions - previous.hydrated_regions
        rate = max(done, 0) * region_bytes / elapsed
        remaining = (status.total_regions - status.hydrated_regions) \
            * region_bytes
        if remaining == 0:
            eta = 0.0
        elif rate > 0:
            eta = remaining / rate
    return Progress(status.hydrated_regions, status.total_regions,
                    region_bytes, rate, eta, stalled)


def advanced_at(status, previous, previous_since, now):
    """When the clone last made hydration progress, as of ``now``.

    A clone is only stalled while it should be copying: hydration on, not
    finished, and the same hydrated count as at the previous tick.  A clone
    waiting for its commit (hydration off) or seen for the first time
    counts as advancing now.  The kernel itself never gives up on a
    source it cannot read (it retries the regions on its next pass), so
    this is the only place a dead path to the source becomes visible.
    """
    if (previous is None or previous_since is None
            or not status.hydration_enabled or status.fully_hydrated
            or status.hydrated_regions > previous.hydrated_regions):
        return now
    return previous_since


@dataclasses.dataclass
class TickReport:
    """What one tick saw and did, for logs and tests."""

    seen: int = 0
    handled: int = 0
    failed: list = dataclasses.field(default_factory=list)


class HydrationMonitor(object):
    """Watches clone targets and reports each one to ``on_status``.

    ``on_status(lv_name, status, progress)`` is called once per tick for
    every clone target that is a handle of this backend's volume group
    (``dmclone-<vg>-<lv>``, see :mod:`cinder_dmclone.layout`);
    ``status`` is a CloneStatus or FailedCloneStatus from
    :mod:`cinder_dmclone.dmsetup`.  Devices that are not ours are ignored.
    ``after_tick()``, if given, runs once per tick after the statuses
    (work that no clone target reports any more, such as finishing a
    transfer whose clone is already linear).
    """

    def __init__(self, dm, volume_group, on_status, interval,
                 clock=time.monotonic, after_tick=None):
        self._dm = dm
        self._volume_group = volume_group
        self._on_status = on_status
        self._after_tick = after_tick
        self._interval = interval
        self._clock = clock
        self._last = {}
        self._timer = None

    def tick(self):
        """Run one pass; never raises for a single volume's failure."""
        report = TickReport()
        now = self._clock()
        errors = {}
        try:
            statuses = self._dm.clone_statuses(errors=errors)
        except Exception:
            LOG.exception('Hydration monitor could not read clone status.')
            report.failed.append(None)
            return report
        current = self._unreadable(errors, report)
        for name, status in sorted(statuses.items()):
            lv_name = layout.lv_name_from_handle(name, self._volume_group)
            if lv_name is None:
                continue
            report.seen += 1
            progress = None
            if not status.failed:
                then, prev, since = self._last.get(lv_name,
                                                   (None, None, None))
                since = advanced_at(status, prev, since, now)
                progress = compute_progress(
                    status, prev, None if then is None else now - then,
                    stalled=now - since)
                current[lv_name] = (now, progress, since)
            try:
                self._on_status(lv_name, status, progress)
                report.handled += 1
            except Exception:
                LOG.exception('Hydration monitor failed on %s; carrying on '
                              'with the other volumes.', lv_name)
                report.failed.append(lv_name)
        self._last = current
        if self._after_tick is not None:
            try:
                self._after_tick()
            except Exception:
                LOG.exception('Hydration monitor follow-up work failed.')
        return report

    def _unreadable(self, errors, report):
        """Log the status lines that could not be parsed, one by one.

        Such a volume is skipped this tick and keeps its previous sample
        (so its rate and stall time carry on); the other volumes are
        handled as usual.  Devices that are not this backend's handles
        are not its business.  Returns the samples to carry over.
        """
        kept = {}
        for name, exc in sorted(errors.items(), key=lambda e: str(e[0])):
            lv_name = None if name is None else layout.lv_name_from_handle(
                name, self._volume_group)
            if name is not None and lv_name is None:
                continue
            LOG.error('Hydration monitor cannot read the status of %s; '
                      'skipping it this tick: %s', name or 'a device', exc)
            report.failed.append(lv_name)
            if lv_name in self._last:
                kept[lv_name] = self._last[lv_name]
        return kept

    def start(self):
        """Start ticking every ``interval`` seconds in the service."""
        if self._timer is None:
            self._timer = loopingcall.FixedIntervalLoopingCall(self.tick)
            self._timer.start(interval=self._interval,
                              initial_delay=self._interval,
                              stop_on_exception=False)
        return self._timer

    def stop(self):
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
