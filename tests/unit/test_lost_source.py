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

"""Abandoning a move's lost source, in the two-node model.

Node A (the source) is powered off for good while node B hydrates; the
operator runs ``cinder-dmclone move abandon-source`` on node B
(:class:`cinder_dmclone.lost_source.LostSource`).  The fakes check what
must never happen besides the cluster's own invariants: a region read to
find what was never copied over anything but the ``error`` stand-in, a
region zeroed while any table could reach it, a linear handle over an LV
whose uncopied regions are not zeroed yet.
"""

import bisect
import itertools
import json
import os

import ddt
import fixtures
import oslo_messaging

from cinder import exception
from cinder.objects import fields
from cinder.tests.unit import test

from cinder_dmclone import destination
from cinder_dmclone import dmsetup
from cinder_dmclone import hydration
from cinder_dmclone import layout
from cinder_dmclone import lost_source
from cinder_dmclone import map_mark
from cinder_dmclone import move
from cinder_dmclone import recovery
from cinder_dmclone import source
from tests.harness import fake_cluster as cl

GONE = layout.lost_source_name(cl.VG, cl.LV)
GONE_PATH = dmsetup.device_path(GONE)
META_PATH = '/dev/%s/%s' % (cl.VG, cl.META)
REGIONS = cl.SECTORS // cl.REGION
REGION_BYTES = cl.REGION * 512
LINEAR = [dmsetup.linear_segment(0, cl.SECTORS, cl.LV_PATH)]


class Crash(cl.Crash):
    pass


class Harness(object):
    """A volume hydrating from node A to node B, node A then lost.

    ``hydrated`` is the set of regions node B's clone holds (the fake
    clone's count follows it).  The probe, the zeroing and the status
    update of the command are this harness's, and check the invariants.
    """

    def __init__(self, test, hydrated=range(100), reboot=False):
        self.test = test
        self.c = cl.Cluster(test, reboot=reboot)
        self.c.attach(self.c.b)
        self.t = self.c.transfer()
        assert self.t.state == move.HYDRATING, self.t
        self.set_hydrated(hydrated)
        self.state_dir = test.useFixture(fixtures.TempDir()).path
        self.sessions = {'session1': 'FAILED'}
        self.zeroed = []
        self.probes = 0
        #: called after each probe (a write racing the scan)
        self.after_probe = None
        #: regions of LV the probe finds unreadable besides the uncopied
        self.unreadable = set()
        self.crash_in = None
        self.b.dm.sizes[GONE_PATH] = cl.SECTORS
        self._check_table = self.b.dm.check_table
        self.b.dm.check_table = self.check_table
        hydrate = self.b.dm.hydrate
        # (The fake copies whatever its source; a lost one gives nothing.)
        self.b.dm.hydrate = lambda name, regions=None: (
            self.b.dm.status(name)[0].clone.hydrated_regions if self.a.down
            else hydrate(name, regions))

    @property
    def a(self):
        return self.c.a

    @property
    def b(self):
        return self.c.b

    def set_hydrated(self, regions):
        self.hydrated = set(regions)
        self.c.b.dm.meta_hydrated[META_PATH] = len(self.hydrated)

    def uncopied(self):
        return sorted(set(range(REGIONS)) - self.hydrated)

    def lose_a(self):
        """Node A loses power for good: its service and kernel are gone."""
        self.a.reboot()
        self.a.down = True
        self.a.service_up = False

    # -- the command's hooks ------------------------------------------------

    def command(self, **kwargs):
        return lost_source.LostSource(
            {'node-b'}, self.b.store, self.b.dest, self.state_dir,
            load_volume=lambda ctxt, vid: self.c.volume(vid),
            service_is_up=source.service_is_up,
            session_states=lambda iqn: dict(self.sessions),
            probe=self.probe, zero=self.zero, set_status=self.set_status,
            clock=lambda: 1764115200.0,
            **dict({'thin_maps': self.b.thin_maps()}, **kwargs))

    def arm_crash(self, step, when):
        """Crash the next run at ``step`` (owner, attribute, match).

        Returns the crash point's record (``fired``), or None for a crash
        in the harness's own part of the command.
        """
        owner, attr, match = step
        if owner == 'harness':
            self.crash_in = attr
            return None
        obj = {'store': self.b.store, 'dm': self.b.dm,
               'dest': self.b.dest}[owner]
        return self.c.crash_at(obj, attr, when, match)

    def run(self, force=False):
        return self.command().run(cl.VOLUME_ID, force=force)

    def crash_then_restart(self, step, when):
        """A run crashes at ``step`` (see :meth:`arm_crash`); B restarts.

        No violation at the crash nor after node B's service restarted
        and settled.
        """
        t = self.test
        fired = self.arm_crash(step, when)
        t.assertRaises(cl.Crash, self.run)
        if fired is not None:
            t.assertTrue(fired['fired'])
        t.assertEqual([], self.c.violations)
        self.c.restart(self.b)
        self.c.settle()
        t.assertEqual([], self.c.violations)

    def _crash(self, where):
        if self.crash_in == where:
            self.crash_in = None
            raise Crash(where)

    def probe(self, path, region_bytes, count):
        self._crash('probe')
        t = self.test
        t.assertEqual((cl.HANDLE_PATH, REGION_BYTES, REGIONS),
                      (path, region_bytes, count))
        clone = [s for s in self.b.dm.devices[cl.HANDLE]
                 if s.target == 'clone']
        # Only a read over the error stand-in tells what was copied; over
        # the source it would fetch the region.
        t.assertEqual(GONE_PATH, clone[0].args[2])
        t.assertIn('no_hydration', clone[0].args)
        self.probes += 1
        found = sorted((set(range(count)) - self.hydrated) | self.unreadable)
        if self.after_probe is not None:
            self.after_probe()
        return found

    def zero(self, path, ranges):
        self._crash('zero')
        self.test.assertEqual(cl.LV_PATH, path)
        self._assert_fenced([(offset // 512, length // 512)
                             for offset, length in ranges])
        self.zeroed.extend(ranges)
        zeroed_regions = {(o + i) // REGION_BYTES for o, n in self.zeroed
                          for i in range(0, n, REGION_BYTES)}
        if zeroed_regions >= set(self.uncopied()):
            self.b.vg.lvs[cl.LV]['complete'] = True

    def _assert_fenced(self, extents):
        """Nothing maps these [(sector, count)] but an ``error`` segment.

        Each segment over the LV is looked up among the extents sorted
        (a fenced clone has a segment per range: checking every extent
        against every segment took minutes under coverage).
        """
        extents = sorted((start, start + count) for start, count in extents)
        starts = [start for start, _end in extents]
        reach = list(itertools.accumulate(
            (end for _start, end in extents), max))
        for name, segments in self.b.dm.devices.items():
            for seg in segments:
                if seg.target == 'error' or cl.LV_PATH not in seg.args:
                    continue
                # extents starting before the segment ends; any reaching
                # past its start overlaps it
                i = bisect.bisect_left(starts, seg.end)
                if i and reach[i - 1] > seg.start:
                    self.c.violation('zeroed sectors in %d..%d while %s '
                                     'maps them: %s' % (
                                         seg.start, seg.end, name, seg))

    def set_status(self, ctxt, volume, status, expected):
        self._crash('set_status')
        rec = self.c.db.volumes[volume['id']]
        if rec.get('status', 'available') not in expected:
            return False
        rec['status'] = status
        return True

    def check_table(self, name, segments):
        """A table with error segments must fence exactly the uncopied."""
        if not any(s.target == 'error' for s in segments):
            self._check_table(name, segments)
            return
        if name != cl.HANDLE:
            return      # the stand-in itself
        fenced = set()
        for seg in segments:
            if seg.target == 'error':
                fenced |= set(range(seg.start // cl.REGION,
                                    -(-seg.end // cl.REGION)))
        if fenced != set(self.uncopied()):
            self.c.violation('fencing table maps %d regions to error, %d '
                             'were never copied' % (len(fenced),
                                                    len(self.uncopied())))

    # -- checks -------------------------------------------------------------

    def expected_ranges(self):
        return dmsetup.uncopied_ranges(self.uncopied(), cl.SECTORS,
                                       cl.REGION)

    def assert_abandoned(self, outcome=None):
        t = self.test
        c = self.c
        t.assertEqual([], c.violations)
        t.assertNotIn('dmclone_state', c.transfer_keys())
        rec = c.db.volumes[cl.VOLUME_ID]
        t.assertEqual(('error', None, self.b.host),
                      (rec['status'], rec['provider_location'], rec['host']))
        ranges = self.expected_ranges()
        md = c.db.admin_metadata[cl.VOLUME_ID]
        path = os.path.join(self.state_dir, 'lost-%s.json' % cl.VOLUME_ID)
        recorded = {k: v for k, v in md.items()
                    if k.startswith('dmclone_lost')}
        expected = {
            'dmclone_lost_source': 'node-a',
            'dmclone_lost_at': '2025-11-26T00:00:00Z',
            'dmclone_lost_regions': str(len(self.uncopied())),
            'dmclone_lost_bytes': str(len(self.uncopied()) * REGION_BYTES),
            'dmclone_lost_ranges': dmsetup.ranges_text(ranges, 255),
            'dmclone_lost_ranges_file': path,
            'dmclone_lost_source_lv': cl.LV,
            'dmclone_lost_source_target': '10.0.0.1:3260 %s'
                                          % cl.FakeTargetIQN}
        t.assertEqual(expected, recorded)
        t.assertLessEqual(len(md['dmclone_lost_ranges']), 255)
        with open(path) as f:
            t.assertEqual([list(r) for r in ranges], json.load(f)['ranges'])
        # node B: the whole LV mapped linearly, nothing else left
        t.assertEqual({cl.HANDLE: LINEAR}, self.b.dm.devices)
        t.assertEqual([cl.LV], list(self.b.vg.lvs))
        t.assertEqual({}, self.b.connector.sessions)
        t.assertEqual(_regions(ranges), _regions(self.zeroed))
        # node A's copy is left as it was: never wiped, never deleted
        t.assertEqual([cl.LV], list(self.a.vg.lvs))
        t.assertEqual([], self.a.wiped)
        if outcome is not None:
            t.assertEqual(
                (cl.VOLUME_ID, 'error', 'node-a', REGION_BYTES, REGIONS,
                 len(self.uncopied()), ranges, path),
                (outcome.volume_id, outcome.status, outcome.source_node,
                 outcome.region_bytes, outcome.total_regions,
                 outcome.uncopied_regions, outcome.ranges,
                 outcome.ranges_file))
            t.assertEqual({'node': 'node-a', 'host': self.a.host,
                           'lv': cl.LV, 'target_iqn': cl.FakeTargetIQN,
                           'target_portal': '10.0.0.1:3260'},
                          outcome.left_on_source)

    def assert_extended_tail_kept(self, outcome):
        """Abandoned after an extend to twice the size, during hydration.

        The clone covered the old length, the tail was mapped linearly
        and was never the source's: the whole LV ends mapped linearly,
        only the clone's uncopied regions zeroed.
        """
        t = self.test
        t.assertEqual([], self.c.violations)
        t.assertEqual(
            {cl.HANDLE: [dmsetup.linear_segment(0, 2 * cl.SECTORS,
                                                cl.LV_PATH)]},
            self.b.dm.devices)
        t.assertEqual(self.expected_ranges(), outcome.ranges)
        t.assertEqual(_regions(outcome.ranges), _regions(self.zeroed))


def _regions(ranges):
    return {(o + i) // REGION_BYTES for o, n in ranges
            for i in range(0, n, REGION_BYTES)}


class AbandonTestCase(test.TestCase):

    def test_front_to_back_hydration_half_copied(self):
        h = Harness(self, hydrated=range(REGIONS // 2 - 3))
        h.lose_a()
        h.assert_abandoned(h.run())
        self.assertEqual([(REGION_BYTES * (REGIONS // 2 - 3),
                           REGION_BYTES * (REGIONS // 2 + 3))],
                         h.expected_ranges())

    def test_the_nodes_thin_mapped_mark_goes(self):
        # (The command runs on the destination, in the service's
        # <state_path>/dmclone: the clone it ends needs no guard.)
        h = Harness(self, hydrated=range(10))
        marks = map_mark.MapMarks(
            map_mark.marks_dir(h.state_dir, h.t.dest_node))
        marks.write(cl.VOLUME_ID, move.thin_map_tag(h.t.secret))
        h.lose_a()
        h.assert_abandoned(h.run())
        self.assertIsNone(marks.read(cl.VOLUME_ID))

    def test_scattered_writes_and_copies(self):
        # Hydrated front to back, plus whole-region writes of the
        # instance here and there: every run of uncopied regions is found.
        hydrated = set(range(40)) | {100, 101, 7000, REGIONS - 1}
        h = Harness(self, hydrated=hydrated)
        h.lose_a()
        outcome = h.run()
        h.assert_abandoned(outcome)
        self.assertEqual([(40, 100), (102, 7000), (7001, REGIONS - 1)],
                         [(o // REGION_BYTES, (o + n) // REGION_BYTES)
                          for o, n in outcome.ranges])

    def test_nothing_copied_yet(self):
        h = Harness(self, hydrated=())
        h.lose_a()
        h.assert_abandoned(h.run())
        self.assertEqual([(0, cl.SECTORS * 512)], h.expected_ranges())

    def test_a_node_b_reboot_first(self):
        # Node B rebooted after node A was lost: its start could not
        # rebuild the clone (no source), the handle is gone; the command
        # builds the clone over the stand-in from the metadata LV.
        h = Harness(self, hydrated=range(300), reboot=True)
        h.lose_a()
        h.c.restart(h.b)
        self.assertFalse(h.b.dm.exists(cl.HANDLE))
        self.assertIn(cl.VOLUME_ID, h.b.moves.recovery.pending_rebuild)
        h.assert_abandoned(h.run())
        # and the monitor forgets the rebuild it was waiting for
        h.c.tick(h.b)
        self.assertEqual({}, h.b.moves.recovery.pending_rebuild)

    def test_an_extended_volume_keeps_its_tail(self):
        # Extended during hydration: the clone covers the old length,
        # the tail is mapped linearly and was never the source's.
        h = Harness(self, hydrated=range(10))
        h.b.destination.extend(h.c.volume(), lambda: h.b.vg.extend_volume(
            cl.LV, '2g'))
        h.lose_a()
        h.assert_extended_tail_kept(h.run())

    def test_a_cloned_move_too(self):
        # A live migration whose source was lost before the switch-over:
        # hydration off, only the regions written here are on node B.
        h = Harness(self, hydrated=())
        h.c.set_state(h.t, move.CLONED)
        h.set_hydrated({5, 6, 9})
        h.lose_a()
        h.assert_abandoned(h.run())

    def test_a_write_during_the_scan_makes_it_scan_again(self):
        h = Harness(self, hydrated=range(50))

        def write_once():
            h.after_probe = None
            h.set_hydrated(h.hydrated | {60})   # a whole-region write
        h.after_probe = write_once
        h.lose_a()
        outcome = h.run()
        self.assertEqual(2, h.probes)
        h.assert_abandoned(outcome)
        self.assertNotIn(60, _regions(outcome.ranges))

    def test_writes_racing_every_scan_zero_nothing(self):
        h = Harness(self, hydrated=range(50))
        written = iter(range(1000, 2000))

        def write():
            h.set_hydrated(h.hydrated | {next(written)})
        h.after_probe = write
        h.lose_a()
        self.assertRaises(lost_source.ScanRaced, h.run)
        self.assertEqual(lost_source.LostSource.ATTEMPTS, h.probes)
        self.assertEqual([], h.zeroed)
        self.assertEqual([], h.c.violations)
        # the clone still serves what it has, over the stand-in
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertIsNotNone(h.b.vg.get_volume(cl.META))
        # once the instance stops, the command finishes
        h.after_probe = None
        h.assert_abandoned(h.run())

    def test_an_unreadable_copied_region_zeroes_nothing(self):
        h = Harness(self, hydrated=range(50))
        h.unreadable = {10}
        h.lose_a()
        self.assertRaises(lost_source.ScanInconsistent, h.run)
        self.assertEqual([], h.zeroed)
        self.assertEqual([], h.c.violations)
        self.assertIsNotNone(h.b.vg.get_volume(cl.META))
        h.unreadable = set()
        h.assert_abandoned(h.run())

    def test_the_output_says_what_is_left_on_the_source(self):
        h = Harness(self)
        h.lose_a()
        outcome = h.run()
        self.assertEqual(len(h.uncopied()) * REGION_BYTES,
                         outcome.uncopied_bytes)
        h.assert_abandoned(outcome)

    def test_many_ranges_are_cut_in_the_record(self):
        # every other region copied: 8191 ranges
        h = Harness(self, hydrated=range(0, REGIONS, 2))
        h.lose_a()
        outcome = h.run()
        h.assert_abandoned(outcome)
        text = h.c.db.admin_metadata[cl.VOLUME_ID]['dmclone_lost_ranges']
        self.assertLessEqual(len(text), 255)
        self.assertRegex(text, r',\.\.\.\+\d+ more$')
        self.assertEqual(REGIONS // 2, len(outcome.ranges))


@ddt.ddt
class RefusalTestCase(test.TestCase):
    """Refusals change nothing: the record, the kernel, the database."""

    def setUp(self):
        super().setUp()
        self.h = Harness(self)
        self.h.lose_a()

    def snapshot(self):
        c = self.h.c
        return (dict(c.db.admin_metadata.get(cl.VOLUME_ID, {})),
                dict(c.db.volumes[cl.VOLUME_ID]),
                {k: list(v) for k, v in self.h.b.dm.devices.items()},
                dict(self.h.b.connector.sessions), sorted(self.h.b.vg.lvs))

    def assert_refused(self, text, force=False, volume_id=cl.VOLUME_ID):
        before = self.snapshot()
        exc = self.assertRaises(lost_source.Refused,
                                self.h.command().run, volume_id, force)
        self.assertIn(text, str(exc))
        self.assertEqual(before, self.snapshot())
        self.assertEqual([], self.h.zeroed)
        self.assertEqual(0, self.h.probes)
        return exc

    def test_no_such_volume(self):
        self.assert_refused('no such volume', volume_id='nonexistent')

    def test_no_move(self):
        self.h.c.db.admin_metadata[cl.VOLUME_ID] = {}
        self.assert_refused('no move of it is recorded')

    def test_aborted(self):
        self.h.c.set_state(self.h.t, move.ABORTED)
        self.assert_refused('no move of it is recorded')

    def test_another_destination(self):
        cmd = self.h.command()
        cmd.node_names = frozenset({'node-c'})
        self.assertRaisesRegex(lost_source.Refused,
                               'moves to node-b, not to this node \\(node-c',
                               cmd.run, cl.VOLUME_ID)

    def test_preparing(self):
        self.h.c.set_state(self.h.t, move.PREPARING)
        self.assert_refused('still being prepared')

    def test_a_record_naming_a_third_node(self):
        # (Changed by someone else: never repointed, nor ended on.)
        self.h.c.db.volumes[cl.VOLUME_ID]['host'] = 'node-c@dmclone#dmclone'
        self.assert_refused('names node-c@dmclone#dmclone, neither node')

    def test_finalizing_uses_the_unmanage_path(self):
        self.h.c.set_state(self.h.t, move.FINALIZING)
        exc = self.assert_refused('its hydration finished')
        self.assertIn('unmanage', str(exc))

    @ddt.data('attaching', 'detaching', 'deleting', 'maintenance')
    def test_volume_busy(self, status):
        self.h.c.db.volumes[cl.VOLUME_ID]['status'] = status
        self.assert_refused('its status is %s' % status)

    def test_source_service_up(self):
        self.h.a.service_up = True
        exc = self.assert_refused('still reports up')
        self.assertIn('--force', str(exc))

    def test_source_session_logged_in(self):
        self.h.sessions = {'session7': 'LOGGED_IN'}
        self.assert_refused('session7')

    def test_force_overrides_both(self):
        self.h.a.service_up = True
        self.h.sessions = {'session7': 'LOGGED_IN'}
        self.h.assert_abandoned(self.h.command().run(cl.VOLUME_ID,
                                                     force=True))

    def test_no_metadata_lv(self):
        # (Its data on this node cannot be told apart: never zero blind.)
        self.h.b.dm.remove(cl.HANDLE)
        del self.h.b.vg.lvs[cl.META]
        self.assert_refused('metadata LV %s is not on this node' % cl.META)

    def test_fully_hydrated(self):
        self.h.set_hydrated(range(REGIONS))
        self.assert_refused('fully hydrated')


#: every step of the command, and a test-chosen call of it to crash in
STEPS = [
    ('store', 'transition', None),
    ('dm', 'create', lambda name, *a, **k: name == GONE),
    ('dm', 'swap', lambda name, segs, **k: not any(
        s.target == 'error' for s in segs)),
    ('dest', 'disconnect_source', None),
    ('harness', 'probe', None),
    ('dm', 'swap', lambda name, segs, **k: any(
        s.target == 'error' for s in segs)),
    ('store', 'record_loss', None),
    ('harness', 'zero', None),
    ('dest', 'remove_metadata', None),
    ('dm', 'reload', None),
    ('dm', 'remove', lambda name, *a, **k: name == GONE),
    ('store', 'forget_source_export', None),
    ('harness', 'set_status', None),
    ('store', 'clear', None),
]
CRASHES = [(i, when, reboot) for i in range(len(STEPS))
           for when in ('before', 'after') for reboot in (False, True)
           if not (STEPS[i][0] == 'harness' and when == 'after')]


@ddt.ddt
class CrashTestCase(test.TestCase):
    """A crash at any step: running the command again finishes the job.

    Node B's service restarts (or node B reboots) in between; neither
    its recovery nor its monitor touch the move meanwhile.
    """

    @ddt.data(*CRASHES)
    @ddt.unpack
    def test_crash_then_run_again(self, step, when, reboot):
        h = Harness(self, hydrated=set(range(200)) | {5000}, reboot=reboot)
        h.lose_a()
        h.crash_then_restart(STEPS[step], when)
        if h.c.transfer() is not None:
            # the service left it alone, and waits for the operator
            self.assertIn(h.c.transfer().state,
                          (move.HYDRATING, move.SOURCE_LOST))
            h.assert_abandoned(h.run())
        else:
            # (it crashed after clearing the move: already done)
            h.assert_abandoned()


#: the steps a move found whole takes (nothing fenced, zeroed, or set
#: to error; the scan's table, with no region fenced, is the linear one)
WHOLE_STEPS = [i for i, step in enumerate(STEPS)
               if step[:2] not in (('harness', 'zero'),
                                   ('harness', 'set_status'),
                                   ('dm', 'reload'))
               and i != 5]
WHOLE_CRASHES = [(i, when) for i in WHOLE_STEPS
                 for when in ('before', 'after')
                 if not (STEPS[i][0] == 'harness' and when == 'after')]


@ddt.ddt
class FinalizingWithoutItsSourceTestCase(test.TestCase):
    """A finalization that can no longer end: node B rebooted, A lost.

    Review 22 #2.  Node B's monitor found the clone fully hydrated and
    recorded ``finalizing``; the swap to linear (or the removal of the
    metadata LV after it) had not been made for good when node B
    rebooted, and node A is lost for good.  Node B's start plans to
    rebuild the clone from its metadata LV, which needs the source:
    it never can.  The command ends the move over the stand-in like any
    other; every region is found copied, so the volume keeps its data
    and its status.
    """

    def stuck(self, hydrated=range(REGIONS)):
        h = Harness(self, hydrated=hydrated, reboot=True)
        # (The fake LV holds every region the metadata says it does.)
        h.b.vg.lvs[cl.LV]['complete'] = not h.uncopied()
        h.c.set_state(h.t, move.FINALIZING)
        h.lose_a()
        h.c.restart(h.b)
        self.assertFalse(h.b.dm.exists(cl.HANDLE))
        self.assertIn(cl.VOLUME_ID, h.b.moves.recovery.pending_rebuild)
        self.assertEqual(move.FINALIZING, h.c.transfer().state)
        return h

    def assert_ended_whole(self, h, status, outcome=None):
        self.assertEqual([], h.c.violations)
        self.assertNotIn('dmclone_state', h.c.transfer_keys())
        rec = h.c.db.volumes[cl.VOLUME_ID]
        self.assertEqual((status, None, h.b.host),
                         (rec.get('status', 'available'),
                          rec['provider_location'], rec['host']))
        self.assertEqual({cl.HANDLE: LINEAR}, h.b.dm.devices)
        self.assertEqual([cl.LV], list(h.b.vg.lvs))
        self.assertEqual({}, h.b.connector.sessions)
        self.assertEqual([], h.zeroed)
        md = h.c.db.admin_metadata[cl.VOLUME_ID]
        self.assertEqual(('node-a', '0', '0'),
                         (md['dmclone_lost_source'],
                          md['dmclone_lost_regions'],
                          md['dmclone_lost_bytes']))
        # node A's copy is left as it was, for the operator
        self.assertEqual([cl.LV], list(h.a.vg.lvs))
        self.assertEqual([], h.a.wiped)
        if outcome is not None:
            self.assertEqual((status, 0, []), (outcome.status,
                                               outcome.uncopied_regions,
                                               outcome.ranges))

    def test_every_region_copied_ends_it_keeping_the_status(self):
        h = self.stuck()
        status = h.c.db.volumes[cl.VOLUME_ID].get('status', 'available')
        self.assertNotEqual('error', status)
        self.assert_ended_whole(h, status, h.run())
        # the monitor forgets the rebuild it waited for; nothing else
        h.c.tick(h.b)
        self.assertEqual({}, h.b.moves.recovery.pending_rebuild)
        self.assert_ended_whole(h, status)

    def test_a_region_not_committed_before_the_reboot_is_lost(self):
        # (The metadata LV is what was committed: a region hydrated in
        # memory only when node B lost power was never copied for good.)
        h = self.stuck(hydrated=set(range(REGIONS)) - {4000})
        h.assert_abandoned(h.run())
        self.assertEqual([(4000 * REGION_BYTES, REGION_BYTES)],
                         h.expected_ranges())

    def test_refused_while_its_handle_is_loaded(self):
        # (The finalization goes on by itself: only its retire waits.)
        h = Harness(self, hydrated=range(REGIONS))
        h.c.set_state(h.t, move.FINALIZING)
        h.lose_a()
        exc = self.assertRaises(lost_source.Refused, h.run)
        self.assertIn('its hydration finished', str(exc))
        self.assertEqual(move.FINALIZING, h.c.transfer().state)
        self.assertEqual(0, h.probes)

    def test_refused_once_its_metadata_lv_is_gone(self):
        # (Swapped and its metadata LV removed: whole, and the unmanage
        # path of the operations guide takes it.)
        h = self.stuck()
        del h.b.vg.lvs[cl.META]
        exc = self.assertRaises(lost_source.Refused, h.run)
        self.assertIn('unmanage', str(exc))
        self.assertEqual(move.FINALIZING, h.c.transfer().state)

    @ddt.data(*WHOLE_CRASHES)
    @ddt.unpack
    def test_crash_then_run_again(self, step, when):
        h = self.stuck()
        status = h.c.db.volumes[cl.VOLUME_ID].get('status', 'available')
        h.crash_then_restart(STEPS[step], when)
        if h.c.transfer() is not None:
            self.assertIn(h.c.transfer().state,
                          (move.FINALIZING, move.SOURCE_LOST))
            self.assert_ended_whole(h, status, h.run())
        else:
            self.assert_ended_whole(h, status)


class ServicesTestCase(test.TestCase):
    """Neither node's service fights the abandon, before or after."""

    def test_monitor_leaves_a_move_being_abandoned_alone(self):
        h = Harness(self, hydrated=range(REGIONS - 5))
        h.lose_a()
        h.crash_in = 'zero'
        self.assertRaises(Crash, h.run)
        # (the handle now maps the 5 uncopied regions to error; put a
        # fully hydrated clone back to tempt the monitor to finalize)
        h.b.dm.devices.pop(cl.HANDLE)
        h.b.dm.sizes[GONE_PATH] = cl.SECTORS
        h.b.dest.build_clone(h.t, GONE_PATH, hydrate=False)
        h.set_hydrated(range(REGIONS))
        report = h.b.monitor.tick()
        self.assertEqual((1, 1, []), (report.seen, report.handled,
                                      report.failed))
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertNotIn('dmclone_percent', h.c.transfer_keys())
        self.assertEqual(set(), h.b.destination.pending_finalize)
        self.assertEqual({}, h.b.tracker.progress)
        h.b.destination.finalize(cl.VOLUME_ID)
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertEqual(set(), h.b.destination.pending_finalize)

    def test_recovery_on_the_destination_waits_for_the_operator(self):
        h = Harness(self, reboot=True)
        h.lose_a()
        h.crash_in = 'probe'
        self.assertRaises(Crash, h.run)
        connects = len(h.b.connector.calls)
        log = self.mock_object(recovery.LOG, 'warning')
        h.c.restart(h.b)
        h.c.settle()
        # no rebuild over the lost source, no rollback, no finalization
        self.assertEqual(connects, len(h.b.connector.calls))
        self.assertFalse(h.b.dm.exists(cl.HANDLE))
        self.assertIsNotNone(h.b.vg.get_volume(cl.META))
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertTrue(any('abandon-source' in c[0][0]
                            for c in log.call_args_list))
        h.assert_abandoned(h.run())

    def test_extend_is_refused_while_it_runs(self):
        h = Harness(self)
        h.lose_a()
        h.crash_in = 'zero'
        self.assertRaises(Crash, h.run)
        grown = []
        self.assertRaises(move.MoveInProgress, h.b.destination.extend,
                          h.c.volume(), lambda: grown.append(1))
        self.assertEqual([], grown)

    def test_the_source_back_during_the_abandon_exports_nothing(self):
        h = Harness(self, reboot=True)
        h.lose_a()
        h.crash_in = 'zero'
        self.assertRaises(Crash, h.run)
        self._source_comes_back(h)
        h.assert_abandoned(h.run())
        self._source_comes_back(h)

    def test_the_source_back_after_the_abandon_exports_nothing(self):
        h = Harness(self, reboot=True)
        h.lose_a()
        h.assert_abandoned(h.run())
        log = self.mock_object(recovery.LOG, 'warning')
        self._source_comes_back(h)
        # its start says what it still holds, for an operator
        said = [c[0][1] for c in log.call_args_list
                if 'move was abandoned' in c[0][0]]
        self.assertEqual(1, len(said))
        self.assertEqual((cl.VOLUME_ID, cl.LV), (said[0]['vol'],
                                                 said[0]['lv']))
        h.assert_abandoned()
        # once an operator removed the copy, the start says nothing
        h.a.vg.delete(cl.LV)
        log.reset_mock()
        h.a.restart()
        h.a.recover()
        self.assertEqual([], [c for c in log.call_args_list
                              if 'move was abandoned' in c[0][0]])

    def _source_comes_back(self, h):
        """Node A boots: its service starts, recovers, its monitor ticks."""
        a = h.a
        a.down = False
        a.service_up = True
        a.restart()
        a.recover()
        h.c.settle()
        # nothing exported, no handle over its stale copy, nothing wiped
        self.assertEqual({}, a.target.exports)
        self.assertEqual({}, a.dm.devices)
        self.assertEqual([cl.LV], list(a.vg.lvs))
        self.assertEqual([], a.wiped)
        self.assertEqual(h.b.host, h.c.db.volumes[cl.VOLUME_ID]['host'])
        self.assertEqual([], h.c.violations)

    def test_tracker_state_is_dropped(self):
        h = Harness(self)
        h.b.monitor.tick()
        self.assertIn(cl.VOLUME_ID, h.b.tracker.progress)
        h.lose_a()
        h.crash_in = 'probe'
        self.assertRaises(Crash, h.run)
        h.b.tracker.on_status(cl.LV, h.b.dm.status(cl.HANDLE)[0].clone,
                              hydration.Progress(1, 2, 3))
        self.assertNotIn(cl.VOLUME_ID, h.b.tracker.progress)
        self.assertEqual({}, h.b.tracker.progress_report())


class ExtendRaceTestCase(test.TestCase):
    """An extend of the volume on node B and abandon-source, both orders.

    Both take the volume's lock, for the whole of their work on node B;
    Cinder's API marks the volume ``extending`` before it asks node B,
    and the command acts only on a volume with no request in flight.
    """

    def setUp(self):
        super().setUp()
        self.h = Harness(self, hydrated=range(10))
        self.h.lose_a()
        self.grown = []

    def grow(self):
        """The driver's LV extend: always under the volume's lock."""
        h = self.h
        self.assertIn('dmclone-%s' % cl.VOLUME_ID, h.c.held)
        h.b.vg.extend_volume(cl.LV, '2g')
        self.grown.append(2 * cl.SECTORS)

    def extend(self):
        return self.h.b.destination.extend(self.h.c.volume(), self.grow)

    def set_status(self, status):
        self.h.c.db.volumes[cl.VOLUME_ID]['status'] = status

    def test_abandon_first_the_extend_is_refused_then_it_finishes(self):
        # The API takes the extend while the command runs (its request
        # to node B waits for the lock the command holds): the command's
        # end finds the volume 'extending' and records nothing; the
        # extend then finds the move being abandoned and is refused
        # before the LV grows; Cinder marks it 'error_extending'.
        # Review 4, finding 7: that status then refused every run of the
        # command again ('wait until it is one of ...'), for good.
        h = self.h

        def extend_requested():
            h.after_probe = None
            self.set_status('extending')
        h.after_probe = extend_requested
        exc = self.assertRaises(lost_source.Refused, h.run)
        self.assertIn('status changed while the command ran', str(exc))
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        exc = self.assertRaises(move.MoveInProgress, self.extend)
        self.assertIn('its lost source is being abandoned', str(exc))
        self.assertEqual([], self.grown)
        self.assertEqual(cl.SECTORS, h.b.dm.device_sectors(cl.LV_PATH))
        self.set_status('error_extending')      # the volume manager
        h.assert_abandoned(h.run())

    def test_extend_first_the_abandon_covers_the_new_size(self):
        # The extend holds the lock while the LV and the clone grow; the
        # command, run meanwhile, finds the volume 'extending' and changes
        # nothing; once the extend is done it maps the whole new LV and
        # zeroes only the regions the clone never copied.
        h = self.h
        self.set_status('extending')
        refused = []

        def grow_while_the_command_runs():
            self.grow()
            before = h.c.transfer_keys()
            refused.append(self.assertRaises(
                lost_source.Refused, h.command().check, h.c.ctxt,
                h.c.volume(), h.c.transfer(), False))
            self.assertEqual(before, h.c.transfer_keys())
        self.assertTrue(h.b.destination.extend(
            h.c.volume(), grow_while_the_command_runs))
        self.assertIn('its status is extending', str(refused[0]))
        self.assertEqual(['clone', 'linear'],
                         [s.target for s in h.b.dm.devices[cl.HANDLE]])
        self.set_status('in-use')               # the volume manager
        h.assert_extended_tail_kept(h.run())

    def test_an_extend_while_a_run_is_to_be_resumed_is_refused(self):
        h = self.h
        h.crash_in = 'zero'
        self.assertRaises(Crash, h.run)
        self.assertRaises(move.MoveInProgress, self.extend)
        self.assertEqual([], self.grown)
        h.assert_abandoned(h.run())


class ReviewTestCase(test.TestCase):
    """Findings of the review of 2026-11-26 (branch rev)."""

    def test_a_move_back_to_the_returned_source_keeps_its_old_copy(self):
        # The abandon leaves node A's old copy, the only copy of the
        # regions node B never got, "never used, exported or removed
        # automatically" (Recovery.report_lost_copies).  Node A comes
        # back; the operator puts the volume back in service; its owner
        # attaches it to an instance on node A: the volume moves B -> A,
        # and node A's prepare tears down "leftovers" named like the
        # volume's LV -- the old copy -- before it builds the clone.
        h = Harness(self, reboot=True)
        h.lose_a()
        h.assert_abandoned(h.run())
        a = h.a
        a.down = False
        a.service_up = True
        a.restart()
        a.recover()
        h.c.settle()
        self.assertEqual([cl.LV], list(a.vg.lvs))
        self.assertEqual([], a.wiped)
        # The operator: status back to available, the old attachment gone.
        h.c.db.volumes[cl.VOLUME_ID]['status'] = 'available'
        for att in list(h.c.attachments):
            h.c.detach(att)
        try:
            h.c.attach(a)
        except Exception:
            pass        # refusing the move would be the fix
        self.assertEqual([], a.wiped,
                         'node A wiped its old copy of the volume, which '
                         'held the only copy of the regions never copied')

    def test_a_delete_while_the_source_is_lost_can_still_be_ended(self):
        # The owner deletes the volume while node A is lost (before, or
        # between two runs of, the command): node B tears its side down,
        # then cannot retire A's copy; the record stays.  Neither a
        # second delete nor the command can end the move then.
        h = Harness(self, reboot=True)
        h.lose_a()
        for att in list(h.c.attachments):
            h.c.attachments.remove(att)
        self.assertRaises(exception.VolumeBackendAPIException, h.c.delete)
        self.assertRaises(exception.VolumeBackendAPIException,
                          h.c.delete)       # the retry
        h.c.db.volumes[cl.VOLUME_ID]['status'] = 'error'  # reset-state
        try:
            h.run()
        except Exception as exc:
            self.fail('the move cannot be ended: %r; record %s'
                      % (exc, h.c.transfer_keys()))


class LostCopyScenario(test.TestCase):
    """Node A, back after the abandon, holds the volume's old copy."""

    def setUp(self):
        super().setUp()
        h = self.h = Harness(self, reboot=True)
        h.lose_a()
        h.assert_abandoned(h.run())
        a = h.a
        a.down = False
        a.service_up = True
        a.restart()
        a.recover()
        h.c.settle()
        # The operator: status back to available, the old attachment gone.
        h.c.db.volumes[cl.VOLUME_ID]['status'] = 'available'
        for att in list(h.c.attachments):
            h.c.detach(att)

    def assert_refused(self, exc):
        h = self.h
        for text in ('cannot move to node node-a', 'LV %s' % cl.LV,
                     'remove it by hand', 'operations guide'):
            self.assertIn(text, str(exc))
        self.assertEqual([], h.c.violations)
        # node A: its old copy as it was, nothing built, nothing wiped
        self.assertEqual([cl.LV], list(h.a.vg.lvs))
        self.assertEqual([], h.a.wiped)
        self.assertEqual({}, h.a.dm.devices)
        self.assertEqual({}, h.a.connector.sessions)
        # node B: the volume stays, usable, its export made for the move
        # gone, no move recorded
        h.c.assert_no_transfer()
        rec = h.c.db.volumes[cl.VOLUME_ID]
        self.assertEqual((h.b.host, None), (rec['host'],
                                            rec['provider_location']))
        self.assertEqual({cl.HANDLE: LINEAR}, h.b.dm.devices)
        self.assertEqual([cl.LV], list(h.b.vg.lvs))
        self.assertEqual({}, h.b.target.exports)
        # the loss record stays
        self.assertEqual(cl.LV, h.c.db.admin_metadata[cl.VOLUME_ID][
            'dmclone_lost_source_lv'])

    def assert_moved_to_a(self):
        h = self.h
        h.c.settle()
        self.assertEqual([], h.c.violations)
        h.c.assert_no_transfer()
        self.assertEqual(h.a.host, h.c.db.volumes[cl.VOLUME_ID]['host'])
        self.assertEqual([cl.LV], list(h.a.vg.lvs))
        self.assertTrue(h.a.vg.lvs[cl.LV]['complete'])
        self.assertEqual({cl.HANDLE: LINEAR}, h.a.dm.devices)
        self.assertEqual({}, h.b.vg.lvs)
        self.assertTrue(any('/%s-dmcwipe-' % cl.LV in p for p in h.b.wiped))


class LostCopyTestCase(LostCopyScenario):
    """No move of the volume to node A may replace its old copy.

    Each (an attach there, a migration) is refused, naming it, until an
    operator removed it; then moves there work again.
    """

    def test_an_attach_on_a_is_refused(self):
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.h.c.attach, self.h.a)
        self.assert_refused(exc)
        # (Cinder 29 leaves the failed attachment_create's attachment
        # reserved, with no host: nothing connected.)
        self.assertEqual([(fields.VolumeAttachStatus.RESERVED, None, None)],
                         [(a['attach_status'], a['attached_host'],
                           a['connector']) for a in self.h.c.attachments])

    def test_a_migration_to_a_is_refused(self):
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.h.c.migrate, self.h.a)
        self.assert_refused(exc)

    def test_an_attach_on_a_once_the_old_copy_is_removed(self):
        h = self.h
        h.a.vg.delete(cl.LV)
        h.c.attach(h.a)
        self.assertEqual(move.HYDRATING, h.c.transfer().state)
        self.assert_moved_to_a()

    def test_a_migration_to_a_once_the_old_copy_is_removed(self):
        h = self.h
        h.a.vg.delete(cl.LV)
        self.assertTrue(h.c.migrate(h.a))
        self.assert_moved_to_a()

    def test_an_abort_node_a_did_not_answer_keeps_the_old_copy(self):
        # Node A's service dies as it is asked to abort the refused move:
        # its recovery finds the move still preparing, then the monitor
        # finds it aborted; neither removes the old copy.
        h = self.h
        fired = h.c.crash_at(h.a.destination, 'abort')
        self.assertRaises(exception.VolumeBackendAPIException,
                          h.c.attach, h.a)
        self.assertTrue(fired['fired'])
        self.assertEqual(move.ABORTED, h.c.transfer().state)
        h.c.settle()
        self.assertEqual([cl.LV], list(h.a.vg.lvs))
        self.assertEqual([], h.a.wiped)
        # (nothing on node A describes the aborted move: its next start
        # drops it)
        h.c.restart(h.a)
        h.c.assert_no_transfer()
        self.assertEqual([cl.LV], list(h.a.vg.lvs))
        self.assertEqual([], h.a.wiped)
        self.assertEqual([], h.c.violations)

    def test_a_half_built_move_here_is_still_torn_down(self):
        # Once the old copy is gone, a move to node A that dies half
        # built leaves nothing on node A: its LV is the move's own.
        h = self.h
        h.a.vg.delete(cl.LV)
        h.c.crash_at(h.a.dest, 'build_clone')
        self.assertRaises(exception.VolumeBackendAPIException,
                          h.c.attach, h.a)
        h.c.settle()
        h.c.assert_no_transfer(aborted_ok=True)
        self.assertEqual({}, h.a.vg.lvs)
        self.assertEqual(h.b.host, h.c.db.volumes[cl.VOLUME_ID]['host'])
        self.assertEqual([], h.c.violations)


#: the steps of the command over a move whose data LV a delete removed
DELETED_STEPS = [
    ('store', 'transition', None),
    ('dest', 'remove_metadata', None),
    ('store', 'record_loss', None),
    ('dm', 'remove', lambda name, *a, **k: name == GONE),
    ('dest', 'disconnect_source', None),
    ('store', 'forget_source_export', None),
    ('harness', 'set_status', None),
    ('store', 'clear', None),
]
DELETED_CRASHES = [(i, when) for i in range(len(DELETED_STEPS))
                   for when in ('before', 'after')
                   if not (DELETED_STEPS[i][0] == 'harness'
                           and when == 'after')]


@ddt.ddt
class DeletedWhileLostTestCase(test.TestCase):
    """A delete while the source is lost tears node B's side down first.

    Its request to retire the source's copy then fails: the move stays,
    and the delete fails at every retry.  The command ends the move (the
    volume's data is gone from node B already); the next delete deletes.
    """

    def delete_fails(self, h):
        for att in list(h.c.attachments):
            h.c.attachments.remove(att)
        self.assertRaises(exception.VolumeBackendAPIException, h.c.delete)
        self.assertIsNotNone(h.c.transfer())
        self.assertIsNone(h.b.vg.get_volume(cl.LV))
        h.c.db.volumes[cl.VOLUME_ID]['status'] = 'error'  # reset-state

    def assert_ended(self, h, outcome=None):
        c = h.c
        self.assertEqual([], c.violations)
        c.assert_no_transfer()
        rec = c.db.volumes[cl.VOLUME_ID]
        self.assertEqual(('error', None, h.b.host),
                         (rec['status'], rec['provider_location'],
                          rec['host']))
        # nothing of the volume is left on node B
        self.assertEqual({}, h.b.dm.devices)
        self.assertEqual({}, h.b.vg.lvs)
        self.assertEqual({}, h.b.connector.sessions)
        self.assertEqual([], h.zeroed)
        # the whole volume is recorded as lost, and what node A holds
        md = c.db.admin_metadata[cl.VOLUME_ID]
        self.assertEqual(
            ('node-a', str(REGIONS), str(cl.SECTORS * 512), cl.LV),
            (md['dmclone_lost_source'], md['dmclone_lost_regions'],
             md['dmclone_lost_bytes'], md['dmclone_lost_source_lv']))
        # node A's copy is left as it was
        self.assertEqual([cl.LV], list(h.a.vg.lvs))
        self.assertEqual([], h.a.wiped)
        if outcome is not None:
            self.assertEqual((REGIONS, [(0, cl.SECTORS * 512)], 'error'),
                             (outcome.uncopied_regions, outcome.ranges,
                              outcome.status))
            self.assertEqual(cl.LV, outcome.left_on_source['lv'])
        # and the volume can be deleted now
        c.delete()
        c.assert_no_transfer()
        self.assertEqual({}, h.b.vg.lvs)
        self.assertEqual({}, h.b.dm.devices)

    def test_delete_before_the_command(self):
        h = Harness(self, reboot=True)
        h.lose_a()
        log = self.mock_object(lost_source.LOG, 'warning')
        self.delete_fails(h)
        self.assert_ended(h, h.run())
        self.assertTrue(any('a delete removed it' in c[0][0]
                            for c in log.call_args_list))

    def test_the_delete_says_what_to_do(self):
        h = Harness(self)
        h.lose_a()
        log = self.mock_object(destination.LOG, 'error')
        self.delete_fails(h)
        text = log.call_args[0][0] % log.call_args[0][1]
        self.assertIn('cinder-dmclone move abandon-source %s'
                      % cl.VOLUME_ID, text)

    def test_delete_after_a_crashed_run(self):
        # The command crashed before zeroing (the fencing table live over
        # the error stand-in, state source_lost); then the delete.
        h = Harness(self, reboot=True)
        h.lose_a()
        h.crash_in = 'zero'
        self.assertRaises(Crash, h.run)
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.delete_fails(h)
        self.assertTrue(h.b.dm.exists(GONE))
        self.assert_ended(h, h.run())

    def test_a_delete_cut_short_between_its_lvs(self):
        # The delete's teardown died after the data LV went, before the
        # metadata LV did: node B restarts; the command removes the rest.
        h = Harness(self)
        h.lose_a()
        for att in list(h.c.attachments):
            h.c.attachments.remove(att)
        h.c.crash_at(h.b.dest, 'remove_metadata')
        self.assertRaises(oslo_messaging.MessagingTimeout, h.c.delete)
        self.assertIsNone(h.b.vg.get_volume(cl.LV))
        self.assertIsNotNone(h.b.vg.get_volume(cl.META))
        h.c.db.volumes[cl.VOLUME_ID]['status'] = 'error'
        self.assert_ended(h, h.run())

    def test_refused_while_the_source_reports_up(self):
        h = Harness(self)
        h.lose_a()
        self.delete_fails(h)
        h.a.service_up = True
        self.assertRaisesRegex(lost_source.Refused, 'still reports up',
                               h.run)
        self.assertEqual(move.HYDRATING, h.c.transfer().state)

    @ddt.data(*DELETED_CRASHES)
    @ddt.unpack
    def test_crash_then_run_again(self, step, when):
        h = Harness(self, reboot=True)
        h.lose_a()
        self.delete_fails(h)
        if step >= 1:
            # (a teardown cut short: the metadata LV is still there)
            h.b.vg.add(cl.META, '8m')
        h.crash_then_restart(DELETED_STEPS[step], when)
        if h.c.transfer() is not None:
            self.assertIn(h.c.transfer().state,
                          (move.HYDRATING, move.SOURCE_LOST))
            self.assert_ended(h, h.run())
        else:
            self.assert_ended(h)


class LaterAbandonTestCase(LostCopyScenario):
    """The loss record names only the latest abandon (review 2).

    The volume moved on from node B to node C; node B was lost in turn and
    an operator abandoned it on node C: record_loss overwrote every
    dmclone_lost_* key.  Node A's old copy, still the only copy of the
    regions the first abandon zeroed, is no longer named by the record;
    LVM still shows it (a data LV without a metadata LV), and a move back
    to node A is refused all the same.
    """

    def setUp(self):
        super().setUp()
        # (What abandon-source on node D records when node C is lost.)
        self.h.b.store.record_loss(self.h.c.ctxt, cl.VOLUME_ID, {
            'lost_source': 'node-c', 'lost_at': '2027-01-01T00:00:00Z',
            'lost_regions': '7', 'lost_bytes': str(7 * REGION_BYTES),
            'lost_ranges': '0+448K',
            'lost_ranges_file': '/var/lib/cinder/dmclone/lost-x.json',
            'lost_source_lv': cl.LV,
            'lost_source_target': '10.0.0.3:3260 %s' % cl.FakeTargetIQN})

    def told(self, log):
        return [c[0][1] for c in log.call_args_list
                if 'move was abandoned' in c[0][0]]

    def test_node_a_still_reports_its_old_copy_at_start(self):
        # Review 4: after the later abandon, node A's start no longer
        # said that it holds an old copy (the report followed the
        # latest loss record only).
        h = self.h
        log = self.mock_object(recovery.LOG, 'warning')
        h.a.restart()
        h.a.recover()
        said = self.told(log)
        self.assertEqual(1, len(said))
        self.assertEqual((cl.VOLUME_ID, cl.LV), (said[0]['vol'],
                                                 said[0]['lv']))
        # until the operator removes it
        h.a.vg.delete(cl.LV)
        log.reset_mock()
        h.a.restart()
        h.a.recover()
        self.assertEqual([], self.told(log))

    def test_the_record_names_every_node_holding_an_old_copy(self):
        md = self.h.c.db.admin_metadata[cl.VOLUME_ID]
        self.assertEqual({'node-a': cl.LV, 'node-c': cl.LV},
                         move.Store.old_copies_of(md))
        self.assertEqual('node-c', md['dmclone_lost_source'])

    def test_a_later_abandon_unprotects_the_old_copy(self):
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.h.c.attach, self.h.a)
        self.assert_refused(exc)
        self.assertIn('without the metadata LV', str(exc))

    def test_a_migration_to_a_is_refused(self):
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.h.c.migrate, self.h.a)
        self.assert_refused(exc)

    def test_an_attach_on_a_once_the_old_copy_is_removed(self):
        h = self.h
        h.a.vg.delete(cl.LV)
        h.c.attach(h.a)
        self.assert_moved_to_a()


class StaleOldCopyKeyTestCase(LostCopyScenario):
    """dmclone_old_copy_<node> outlives the copy it names (review 5).

    The operator does what the guide says (copies back, lvremove on node
    A); the key stays (Cinder has no API to delete admin metadata).  The
    volume moves back to A, then away again: while B hydrates from A's
    LV, A's start must not take that LV for the abandoned old copy.
    """

    def told(self, log):
        return [c[0][1] for c in log.call_args_list
                if 'move was abandoned' in c[0][0]]

    def test_the_live_source_lv_is_no_abandoned_copy(self):
        h = self.h
        h.a.vg.delete(cl.LV)                # the operator, as told
        att, _info = h.c.attach(h.a)        # the volume moves B -> A
        h.c.settle()
        self.assertEqual(h.a.host, h.c.db.volumes[cl.VOLUME_ID]['host'])
        h.c.detach(att)
        h.c.attach(h.b)                     # ... and away again, A -> B
        self.assertEqual(move.HYDRATING, h.c.transfer().state)
        # (A's LV is the only copy of every region B has not copied.)
        self.assertIn(cl.LV, h.a.vg.lvs)
        self.assertIn('dmclone_old_copy_node-a',
                      h.c.db.admin_metadata[cl.VOLUME_ID])
        log = self.mock_object(recovery.LOG, 'warning')
        h.a.restart()                       # node A's service restarts
        h.a.recover()
        said = self.told(log)
        self.assertEqual(
            [], said,
            'node A tells the operator to remove by hand LV %s, the live '
            'source of a move still hydrating: %s' % (cl.LV, said))

    def test_the_live_volume_lv_is_no_abandoned_copy(self):
        h = self.h
        h.a.vg.delete(cl.LV)
        att, _info = h.c.attach(h.a)        # the volume moves B -> A
        h.c.settle()
        h.c.detach(att)
        log = self.mock_object(recovery.LOG, 'warning')
        h.a.restart()
        h.a.recover()
        self.assertEqual([], self.told(log))
