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

"""Hydration: the monitor of the clones on this node, and what it means.

Each tick of the :class:`HydrationMonitor` reads the status of every clone
target on the node with ONE ``dmsetup status --target clone`` call, however
many volumes are moving, works out progress (hydrated/total, rate, ETA)
and hands each handle's status to a callback: the
:class:`HydrationTracker`, which publishes progress, reports stalls and
orphans, and has finished clones finalized.  A failure on one volume, in
its callback or in the parse of its status line, is logged and never stops
the others.
"""

import dataclasses
import time

from oslo_log import log as logging
from oslo_service import loopingcall

from cinder import exception
from cinder.volume import volume_utils

from cinder_dmclone import layout
from cinder_dmclone import move

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


class HydrationTracker(object):
    """What the monitor's ticks mean for the moves into this node.

    The monitor's ``on_status``: each clone's status publishes its move's
    progress, reports a stall once (and its end), finalizes a finished
    clone, removes a clone whose move was aborted (through recovery's
    plan) and reports once a clone no move describes.  Its
    :meth:`progress_report` is what the pool stats publish.
    """

    def __init__(self, destination, recovery, stall_timeout=0):
        self.destination = destination
        self.recovery = recovery
        #: the last progress the monitor saw, per volume moving here.
        self.progress = {}
        #: seconds without hydration progress before it is reported; 0: off.
        self.stall_timeout = stall_timeout
        #: volumes moving here whose stall has been reported.
        self.stalled = set()
        #: clone targets here that no move describes (reported once).
        self.orphans = set()

    def _move_of(self, lv_name):
        """(volume id, its move, its record) for a clone's LV.

        The move is None if the record names none or another LV; the
        record is the volume's move as recorded, whatever its LV.
        """
        dest = self.destination
        volume_id = (dest.lv_volumes.get(lv_name)
                     or volume_utils.extract_id_from_volume_name(lv_name))
        try:
            record = dest.load_any(volume_id) if volume_id else None
        except exception.VolumeNotFound:
            record = None
        t = record
        if t is not None and t.lv_name != lv_name:
            t = None
        return volume_id, t, record

    def on_status(self, lv_name, status, progress):
        """Hydration monitor callback for one clone handle."""
        dest = self.destination
        volume_id, t, record = self._move_of(lv_name)
        if volume_id and dest.contradiction(volume_id, record) is not None:
            # This node's own mark names another move than the record (a
            # stale save replaced the record of the move into this node):
            # nothing is done on the record's word.  Written back if it
            # can be (Destination.restore_contradicted), and handled as
            # written back at once (a thin map's guard, say).
            restored = dest.restore_if_free(volume_id)
            if restored is None:
                if not dest.is_dest(t):
                    self._report_orphan(lv_name, volume_id)
                return
            t = restored if restored.lv_name == lv_name else None
        if dest.is_dest(t) and t.state == move.ABORTED:
            # The source gave up while this node was still building (its
            # answer came too late): nothing will ever use this clone.
            self.recovery.resolve_aborted(volume_id, t)
            return
        if dest.is_dest(t) and t.state == move.PREPARING:
            # Being built for a source that waits, or left (longer ago
            # than any attempt lasts) by one that could not record the
            # outcome.
            dest.drop_stale_prepare(volume_id, t)
            return
        if not dest.is_dest(t):
            self._report_orphan(lv_name, volume_id)
            return
        self.orphans.discard(lv_name)
        if t.state == move.SOURCE_LOST:
            # An operator ends this move (cinder-dmclone move
            # abandon-source): no progress, no commit, no finalization.
            self.progress.pop(volume_id, None)
            self.stalled.discard(volume_id)
            return
        if status.failed:
            LOG.error('Clone of volume %(vol)s reports %(st)s: check the '
                      'metadata LV and the path to %(src)s.',
                      {'vol': volume_id, 'st': status.state,
                       'src': t.source_node})
            return
        if t.state == move.CLONED:
            # Source detached but not confirmed closed: ask again.
            dest.commit_pending(volume_id)
        if (t.state == move.HYDRATING and not status.fully_hydrated
                and dest.was_mapped(t)):
            # Built with a thin map: hydrates only while its pool zeroes.
            dest.guard_pool_zeroing(volume_id, t, status)
        if dest.publish_progress(t, progress) is False:
            return      # ended while this tick ran
        self.progress[volume_id] = (t, progress)
        self._report_stall(volume_id, t, progress)
        LOG.info('Volume %(vol)s: %(pct).1f%% hydrated from %(src)s%(eta)s.',
                 {'vol': volume_id, 'pct': progress.percent,
                  'src': t.source_node,
                  'eta': '' if progress.eta is None
                  else ', %d s to go' % progress.eta})
        if t.state == move.HYDRATING and status.fully_hydrated:
            dest.finalize(volume_id)

    def _report_orphan(self, lv_name, volume_id):
        """Say once that a clone here is described by no move.

        It is left from a move that was abandoned (the volume was then
        deleted, or moved elsewhere).  It is never removed automatically:
        an instance may still hold it open.
        """
        if lv_name in self.orphans:
            return
        self.orphans.add(lv_name)
        LOG.warning('Clone target of LV %(lv)s belongs to no transfer into '
                    'this node that this service knows of (volume %(vol)s '
                    'by its name). Before anything else, look the LV up in '
                    'the database: a volume whose _name_id or '
                    'dmclone_lv_name names it is still moving (restart '
                    'this service so that it finds it). Only if none does '
                    'is it left from an abandoned move: then check that '
                    'nothing has it open (dmsetup info), remove it, log '
                    'out of its iSCSI session and delete its LV and '
                    'metadata LV.', {'lv': lv_name,
                                     'vol': volume_id or 'unknown'})

    def _report_stall(self, volume_id, t, progress):
        """Say once that hydration stopped, and once that it came back.

        A path to the source that stays down longer than open-iscsi's
        replacement timeout fails the instance's reads of regions not yet
        copied, and the kernel just keeps retrying the copy: without this
        the operator would see I/O errors in a guest and a frozen
        percentage, and nothing naming the cause.
        """
        if not self.stall_timeout:
            return
        if progress.stalled_seconds >= self.stall_timeout:
            if volume_id not in self.stalled:
                self.stalled.add(volume_id)
                LOG.error('Hydration of volume %(vol)s from %(src)s has '
                          'made no progress for %(s)d s at %(pct).1f%%: '
                          'this node cannot read the source. Reads of '
                          'regions not copied yet wait or fail until it '
                          'can; the source LV on %(src)s still holds the '
                          'data. Check the network path to %(portal)s and '
                          'the iSCSI session to %(iqn)s (iscsiadm -m '
                          'session -P 3); hydration resumes by itself when '
                          'the path is back.',
                          {'vol': volume_id, 'src': t.source_node,
                           's': progress.stalled_seconds,
                           'pct': progress.percent,
                           'portal': t.target_portal, 'iqn': t.target_iqn})
        elif volume_id in self.stalled:
            self.stalled.discard(volume_id)
            LOG.info('Hydration of volume %(vol)s from %(src)s advances '
                     'again (%(pct).1f%%).',
                     {'vol': volume_id, 'src': t.source_node,
                      'pct': progress.percent})

    def progress_report(self):
        """Moves into this node as the pool stats publish them.

        The scheduler's pool listing (``cinder get-pools --detail``) is
        where an admin sees them through the API: the volume's admin
        metadata, which holds the same figures, is not shown by Cinder's
        volume API.  Moves that ended since the last tick are dropped.
        """
        dest = self.destination
        report = {}
        for volume_id, (t, progress) in sorted(self.progress.items()):
            try:
                current = dest.load(volume_id)
            except exception.VolumeNotFound:
                current = None      # deleted since the last tick
            if not dest.is_dest(current):
                self.progress.pop(volume_id, None)
                # A stall reported for a move that ended (rolled back,
                # deleted) must not silence the report of a later one.
                self.stalled.discard(volume_id)
                continue
            entry = dict(progress.as_dict(), state=current.state,
                         source=t.source_node,
                         stalled=volume_id in self.stalled,
                         stale_source_attachment=volume_id in dest.held,
                         awaiting_source=volume_id in dest.awaiting_source)
            report[volume_id] = entry
        return report
