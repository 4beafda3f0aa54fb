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

"""Races around ``cinder-dmclone move abandon-source``, in the two-node model.

1. A volume extend (Cinder's API, then the volume manager on node B,
   then :meth:`DMCloneVolumeDriver.extend_volume
   <cinder_dmclone.driver.DMCloneVolumeDriver.extend_volume>`, the
   driver's own code) before, during (at every step of the command,
   either while the command holds the volume's lock or after it died
   there) and after an abandon of a ``hydrating`` move and of a
   ``finalizing`` move whose clone is not loaded.  What a user needs:
   no data lost, no region read that the volume never got unless it
   reads zeroes, the volume's recorded size that of its LV (and of its
   handle), an extend during the abandon refused with a clear error or
   waiting, and an extend after it that succeeds.
2. The abandon of a ``finalizing`` move into a thin pool: the regions
   never copied read zeroes afterwards, whatever the pool's zeroing,
   and the pool's allocation does not grow for them.

Expected results come from what a user needs; the comments of each
control say which check of the code it relies on.  Findings are
``expectedFailure`` with the sequence and a severity.
"""

import functools
import types
from unittest import mock

import ddt
from oslo_concurrency import processutils

from cinder import exception
from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import driver
from cinder_dmclone import lost_source
from cinder_dmclone import move
from tests.harness import fake_cluster as cl
from tests.unit import test_lost_source as tls

VID = cl.VOLUME_ID
REGIONS = tls.REGIONS
REGION_BYTES = tls.REGION_BYTES
#: sectors of a GiB (the volume's size unit)
GIB = 2097152
LOCK = 'dmclone-%s' % VID


class Harness(tls.Harness):
    """test_lost_source's Harness, on a thin cluster if asked, with hooks.

    ``hooks[where]`` runs once when the command reaches the harness's own
    step ``where`` (probe, zero, set_status), before it.
    """

    def __init__(self, test, hydrated=range(100), reboot=False,
                 thin=False, thin_map=False):
        self.hooks = {}
        make = functools.partial(cl.Cluster, thin=thin, thin_map=thin_map)
        with mock.patch.object(cl, 'Cluster', make):
            super().__init__(test, hydrated=hydrated, reboot=reboot)

    def _crash(self, where):
        hook = self.hooks.pop(where, None)
        if hook is not None:
            hook()
        super()._crash(where)


def hook_at(test, h, step, fn):
    """Run ``fn()`` once, when the command reaches ``step`` (before it).

    ``step`` as test_lost_source.STEPS: (owner, attribute, match).
    Returns a dict whose ``fired`` says whether it ran.
    """
    owner, attr, match = step
    record = {'fired': False}

    def fire():
        record['fired'] = True
        fn()
    if owner == 'harness':
        h.hooks[attr] = fire
        return record
    obj = {'store': h.b.store, 'dm': h.b.dm, 'dest': h.b.dest}[owner]
    original = getattr(obj, attr)

    def hooked(*args, **kwargs):
        if not record['fired'] and (match is None or match(*args, **kwargs)):
            fire()
        return original(*args, **kwargs)
    test.mock_object(obj, attr, side_effect=hooked)
    return record


class NodeDriver(object):
    """DMCloneVolumeDriver's extend, its own code, over a cluster node."""

    extend_volume = driver.DMCloneVolumeDriver.extend_volume
    _refresh_handle = driver.DMCloneVolumeDriver._refresh_handle
    _handle_name = driver.DMCloneVolumeDriver._handle_name
    _linear_table = driver.DMCloneVolumeDriver._linear_table
    _lv_path = driver.DMCloneVolumeDriver._lv_path

    def __init__(self, node):
        self.destination = node.destination
        self.vg = node.vg
        self.dm = node.dm
        self.configuration = types.SimpleNamespace(volume_group=cl.VG)
        self.target_driver = mock.Mock()

    def _sizestr(self, size_in_g):
        return '%sg' % size_in_g


class Cinder(object):
    """Cinder's extend: the API's checks, then the volume manager's call.

    ``request``: cinder.volume.api.API.extend (online extend): only an
    ``available`` or ``in-use`` volume, set ``extending`` at once.
    ``serve``: VolumeManager.extend_volume on the node the record names:
    the driver's extend; on an error ``error_extending``, the size kept;
    else the new size, ``in-use`` or ``available``.
    """

    def __init__(self, h):
        self.h = h

    @property
    def rec(self):
        return self.h.c.db.volumes[VID]

    def request(self, gib):
        status = self.rec.get('status', 'available')
        if status not in ('available', 'in-use'):
            raise exception.InvalidVolume(
                reason='Volume status must be available or in-use, but '
                       'current status is: %s.' % status)
        if gib <= self.rec['size']:
            raise exception.InvalidInput(reason='not larger')
        self.rec['status'] = 'extending'

    def serve(self, gib):
        """The manager's part: None, or the driver's error."""
        c = self.h.c
        volume = c.volume()
        try:
            NodeDriver(c.owner()).extend_volume(volume, gib)
        except Exception as exc:
            self.rec['status'] = 'error_extending'
            return exc
        self.rec['size'] = gib
        self.rec['status'] = ('in-use' if len(volume.volume_attachment)
                              else 'available')
        return None

    def extend(self, gib):
        self.request(gib)
        return self.serve(gib)

    def reset_state(self, status='in-use'):
        """``cinder reset-state --state in-use`` (an admin)."""
        self.rec['status'] = status


class ExtendMixin(object):

    def assert_size_matches(self, h):
        """The recorded size is the LV's, and the handle's if mapped."""
        rec = h.c.db.volumes[VID]
        lv = h.b.dm.device_sectors(cl.LV_PATH)
        self.assertEqual(
            rec['size'] * GIB, lv, 'volume recorded %d GiB, its LV has '
            '%d sectors' % (rec['size'], lv))
        if h.b.dm.exists(cl.HANDLE):
            self.assertEqual(lv, dmsetup.table_length(
                h.b.dm.devices[cl.HANDLE]))

    def assert_ended(self, h, gib, zeroed):
        """The move is over: the whole LV linear, only the uncopied zeroed.

        (No violation: no linear table ever mapped over unzeroed
        uncopied regions, nothing zeroed while a table reached it.)
        """
        self.assertEqual([], h.c.violations)
        self.assertIsNone(h.c.transfer())
        self.assertEqual(
            {cl.HANDLE: [dmsetup.linear_segment(0, gib * GIB, cl.LV_PATH)]},
            h.b.dm.devices)
        self.assertEqual(tls._regions(zeroed), tls._regions(h.zeroed))
        self.assert_size_matches(h)

    def grows_afterwards(self, h, cinder, gib):
        """What a user does next: the extend succeeds, sizes agree.

        (After a reset of an ``error`` the command set.)
        """
        if h.c.db.volumes[VID].get('status') in ('error', 'error_extending'):
            cinder.reset_state()
        self.assertIsNone(cinder.extend(gib))
        self.assertEqual(gib, h.c.db.volumes[VID]['size'])
        self.assertEqual(
            [dmsetup.linear_segment(0, gib * GIB, cl.LV_PATH)],
            h.b.dm.devices[cl.HANDLE])
        self.assert_size_matches(h)
        self.assertEqual([], h.c.violations)

    def extend_during(self, h, cinder, step, zeroed, gib=2):
        """An extend requested while the command is at ``step``.

        Cinder's API marks it ``extending`` at once; the volume manager's
        call to the driver takes the volume's lock: it waits while the
        command holds it (served after the command returned), else it
        runs at once.
        """
        asked = {}

        def requested():
            try:
                cinder.request(gib)
            except exception.InvalidVolume as exc:
                asked['refused'] = exc      # a clear refusal, nothing done
                return
            if LOCK in h.c.held:
                asked['waits'] = True
            else:
                asked['error'] = cinder.serve(gib)
        fired = hook_at(self, h, step, requested)
        try:
            h.run()
        except lost_source.Refused as exc:
            # (the command found the volume 'extending' at its end)
            self.assertIn('status changed while the command ran', str(exc))
            self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        self.assertTrue(fired['fired'])
        self.assertEqual([], h.c.violations)
        if asked.pop('waits', False):
            asked['error'] = cinder.serve(gib)
        error = asked.get('error')
        if error is not None:
            # refused before the LV grew, saying why
            self.assertIsInstance(error, move.MoveInProgress)
            self.assertIn('its lost source is being abandoned', str(error))
            self.assertEqual('error_extending',
                             h.c.db.volumes[VID]['status'])
        if 'refused' in asked:
            self.assertIn('status must be available or in-use',
                          str(asked['refused']))
        self.assert_size_matches(h)
        if h.c.transfer() is not None:
            h.run()                         # the operator runs it again
        grown = 1 if error is not None or 'refused' in asked else gib
        self.assert_ended(h, grown, zeroed)
        if zeroed:
            # the loss shows: no extend made the volume usable again
            self.assertEqual('error', h.c.db.volumes[VID]['status'])
        self.grows_afterwards(h, cinder, grown + 1)

    def extend_after_crash(self, h, cinder, step, zeroed):
        """The command dies at ``step``; an extend comes; it runs again."""
        tls.Harness.crash_then_restart(h, step, 'before')
        gib = 1
        t = h.c.transfer()
        try:
            cinder.request(2)
        except exception.InvalidVolume as exc:
            # (it died after the volume was set 'error')
            self.assertIn('current status is: error', str(exc))
        else:
            error = cinder.serve(2)
            if t is not None and t.state != move.SOURCE_LOST:
                # (it died before it recorded anything: the move is as
                # it was, and an extend of it goes through)
                self.assertIsNone(error)
                gib = 2
            else:
                self.assertIsInstance(error, move.MoveInProgress)
                self.assertIn('its lost source is being abandoned',
                              str(error))
        self.assertEqual(gib * GIB, h.b.dm.device_sectors(cl.LV_PATH))
        self.assert_size_matches(h)
        if h.c.transfer() is not None:
            h.run()
        self.assert_ended(h, gib, zeroed)
        if zeroed:
            self.assertEqual('error', h.c.db.volumes[VID]['status'])
        self.grows_afterwards(h, cinder, gib + 1)


#: test_lost_source's steps, by index (a hook at each, before it)
STEPS = list(range(len(tls.STEPS)))


@ddt.ddt
class ExtendHydratingTestCase(ExtendMixin, test.TestCase):
    """An extend around the abandon of a ``hydrating`` move (thick LV)."""

    def setUp(self):
        super().setUp()
        self.h = Harness(self, hydrated=set(range(200)) | {5000})
        self.h.lose_a()
        self.cinder = Cinder(self.h)

    # Control: relies on Destination.extend extending the clone's table
    # (clone + linear tail, Clones.extend) and on the command mapping
    # the LV's own length at its end (_map_linear), not the clone's.
    def test_extend_before_the_abandon(self):
        h = self.h
        self.assertIsNone(self.cinder.extend(2))
        self.assert_size_matches(h)
        h.run()
        self.assert_ended(h, 2, h.expected_ranges())
        self.assertEqual('error', h.c.db.volumes[VID]['status'])
        self.grows_afterwards(h, self.cinder, 3)

    # Control: relies on the command holding the volume's lock for its
    # whole run (the extend waits), on its conditional status update
    # (expected SETTLED: it records nothing over 'extending'), and on
    # refuse_extend_while_undecided refusing a move 'source_lost'
    # before the LV grows; 'error_extending' is SETTLED, so the command
    # runs again.
    @ddt.data(*STEPS)
    def test_extend_during_the_abandon(self, step):
        self.extend_during(self.h, self.cinder, tls.STEPS[step],
                           self.h.expected_ranges())

    # Control: relies on refuse_extend_while_undecided (source_lost) and
    # on the API refusing an 'error' volume once the command set it.
    @ddt.data(*STEPS)
    def test_extend_after_the_abandon_died(self, step):
        self.extend_after_crash(self.h, self.cinder, tls.STEPS[step],
                                self.h.expected_ranges())

    # MEDIUM (the recorded size no longer matches the LV; no data lost
    # at once).  Sequence: node A is lost while the volume hydrates on
    # node B; node B reboots (its clone cannot be rebuilt without the
    # source: pending_rebuild, no handle); the user extends the volume
    # (1 -> 2 GiB) before the operator runs abandon-source.
    # Destination.extend (destination.py:1818-1824) checks the move
    # (hydrating: allowed), runs grow() -- the LV is now 2 GiB -- and
    # only then Clones.extend, whose dm.table of the missing handle
    # raises DMDeviceNotFound: the manager sets 'error_extending' and
    # keeps size 1.  The abandon ('error_extending' is SETTLED) then
    # maps the whole 2 GiB LV: the instance sees 2 GiB, Cinder records
    # 1 GiB (a backup or a generic migration copies 1 GiB: whatever the
    # guest writes past it is lost there; a later extend to 2 GiB asks
    # lvextend for the size the LV already has).  Expected: refused
    # before the LV grows (or the table extended), size == LV.  Fails
    # on: assert_size_matches after the extend ('volume recorded 1 GiB,
    # its LV has 4194304 sectors').
    # Fixed: Destination.refuse_extend_without_clone.
    def test_extend_while_the_clone_is_not_loaded(self):
        h = Harness(self, hydrated=range(100), reboot=True)
        h.lose_a()
        h.c.restart(h.b)
        self.assertFalse(h.b.dm.exists(cl.HANDLE))
        cinder = Cinder(h)
        error = cinder.extend(2)
        self.assert_size_matches(h)
        h.run()
        gib = 1 if error is not None else 2
        self.assert_ended(h, gib, h.expected_ranges())
        self.grows_afterwards(h, cinder, gib + 1)


def stuck(test, hydrated=range(REGIONS), **kwargs):
    """A ``finalizing`` move whose clone is not loaded; node A lost.

    As test_lost_source's FinalizingWithoutItsSourceTestCase: node B's
    monitor recorded ``finalizing``, node B lost power before the swap
    to linear was made for good, node A is lost for good.  ``hydrated``:
    the regions the metadata LV committed.
    """
    h = Harness(test, hydrated=hydrated, reboot=True, **kwargs)
    h.b.vg.lvs[cl.LV]['complete'] = not h.uncopied()
    h.c.set_state(h.t, move.FINALIZING)
    h.lose_a()
    h.c.restart(h.b)
    test.assertFalse(h.b.dm.exists(cl.HANDLE))
    test.assertEqual(move.FINALIZING, h.c.transfer().state)
    return h


#: the steps of a finalization found whole (test_lost_source.WHOLE_STEPS)
WHOLE = tls.WHOLE_STEPS
#: one region (4000) hydrated in memory only when node B lost power
NOT_COMMITTED = set(range(REGIONS)) - {4000}
#: the steps of a finalization with a region lost (no clone loaded to
#: swap to the stand-in: it is created over it)
STUCK_STEPS = [i for i in STEPS if i != 2]


@ddt.ddt
class ExtendFinalizingTestCase(ExtendMixin, test.TestCase):
    """An extend around the abandon of a ``finalizing`` move, not loaded."""

    # Control: relies on Destination.extend letting a finalizing move's
    # LV grow (the LV is the volume) and on the command mapping the
    # LV's own length at its end (_map_linear), not the clone's.  Every
    # region copied: the volume keeps its status and extends again.
    def test_extend_before_the_abandon(self):
        h = stuck(self)
        cinder = Cinder(h)
        self.assertIsNone(cinder.extend(2))
        self.assert_size_matches(h)
        outcome = h.run()
        self.assertEqual(0, outcome.uncopied_regions)
        self.assertNotEqual('error', h.c.db.volumes[VID]['status'])
        self.assert_ended(h, 2, [])
        self.grows_afterwards(h, cinder, 3)

    # Control: as above, with the region never committed zeroed and the
    # volume set 'error' (the loss); the tail is the LV's, never fenced
    # nor zeroed.
    def test_extend_before_the_abandon_one_region_lost(self):
        h = stuck(self, hydrated=NOT_COMMITTED)
        cinder = Cinder(h)
        self.assertIsNone(cinder.extend(2))
        h.run()
        self.assertEqual('error', h.c.db.volumes[VID]['status'])
        self.assert_ended(h, 2, [(4000 * REGION_BYTES, REGION_BYTES)])
        self.grows_afterwards(h, cinder, 3)

    # Control: relies on the lock (the extend waits, else it would be
    # served at once, mid-command), and, with nothing lost, on the
    # command leaving the status alone (it never sets 'error' over
    # 'extending'; with a loss it sets nothing then and is run again,
    # so the loss keeps showing as 'error'): the waiting extend then
    # finds no move and a record naming node B (_name_this_node), and
    # grows the LV and the linear handle (driver._refresh_handle).
    @ddt.data(*WHOLE)
    def test_extend_during_the_abandon(self, step):
        h = stuck(self)
        self.extend_during(h, Cinder(h), tls.STEPS[step], [])

    # Control: as ExtendHydratingTestCase's, one region lost.
    @ddt.data(*STUCK_STEPS)
    def test_extend_during_the_abandon_one_region_lost(self, step):
        h = stuck(self, hydrated=NOT_COMMITTED)
        self.extend_during(h, Cinder(h), tls.STEPS[step],
                           h.expected_ranges())

    # Control: relies on refuse_extend_while_undecided (source_lost).
    @ddt.data(*WHOLE)
    def test_extend_after_the_abandon_died(self, step):
        h = stuck(self)
        self.extend_after_crash(h, Cinder(h), tls.STEPS[step], [])

    # Control: relies on the move cleared and the record naming node B.
    def test_extend_after_the_abandon(self):
        h = stuck(self)
        cinder = Cinder(h)
        h.run()
        self.assert_ended(h, 1, [])
        self.grows_afterwards(h, cinder, 2)


class ThinLV(object):
    """Node B's thin LV of the volume, as dm-thin keeps it (a model).

    Per region of the clone: what a read returns, ``data`` (the
    volume's), ``zero`` or ``stale`` (an earlier user's data of the
    pool's block); ``provisioned`` holds the pool blocks mapped, of
    ``block_regions`` regions each.  An unprovisioned block reads
    zeroes; a block provisioned by a write holds zeroes around it only
    if the pool zeroes new blocks (no ``skip_block_zeroing``).
    """

    def __init__(self, block_regions=1, zeroing=True):
        self.block_regions = block_regions
        self.zeroing = zeroing
        self.provisioned = set()
        self.content = {}

    def _provision(self, region):
        block = region // self.block_regions
        if block in self.provisioned:
            return
        self.provisioned.add(block)
        first = block * self.block_regions
        for r in range(first, first + self.block_regions):
            self.content[r] = 'zero' if self.zeroing else 'stale'

    def write(self, regions, what='data'):
        for region in regions:
            self._provision(region)
            self.content[region] = what

    def read(self, region):
        if region // self.block_regions not in self.provisioned:
            return 'zero'
        return self.content[region]

    def zeroout(self, ranges):
        """privileged.zero_ranges: BLKZEROOUT, then fsync.

        The ioctl asks the block layer for zeroes without unmapping
        (BLKDEV_ZERO_NOUNMAP); dm-thin offers no WRITE_ZEROES, so zero
        pages are written: every block of the range is provisioned.
        """
        self.write(tls._regions(ranges), 'zero')

    def discard(self, ranges):
        """BLKDISCARD: dm-thin unmaps whole blocks, leaves partial ones."""
        for region in tls._regions(ranges):
            block = region // self.block_regions
            first = block * self.block_regions
            if set(range(first, first + self.block_regions)) <= \
                    tls._regions(ranges):
                self.provisioned.discard(block)


class MappedBlocks(object):
    """A ThinLV's provisioned blocks as its pool's metadata lists them.

    Node B's FakeThinPool answers ``thin_dump`` (and the kernel's count
    of mapped sectors) from these ``(first, end)`` block ranges, read
    afresh each time.
    """

    def __init__(self, lv):
        self.lv = lv

    def __iter__(self):
        ranges = []
        for block in sorted(self.lv.provisioned):
            if ranges and ranges[-1][1] == block:
                ranges[-1][1] = block + 1
            else:
                ranges.append([block, block + 1])
        return iter([tuple(r) for r in ranges])


class ThinHarness(Harness):
    """The volume moves into node B's thin pool; its LV is ``lv``.

    Node B's pool holds ``lv``'s blocks (``block_regions`` regions each)
    and zeroes new ones as ``lv`` does.  The LV counts as complete for
    a linear table once every region never copied reads zeroes.
    """

    def __init__(self, test, lv, hydrated, **kwargs):
        self.lv = lv
        super().__init__(test, hydrated=hydrated, thin=True, **kwargs)
        pool = self.b.pool
        pool.block_sectors = lv.block_regions * cl.REGION
        pool.zeroing = lv.zeroing
        pool.add(cl.LV, ())
        pool.mapped[cl.LV] = MappedBlocks(lv)
        remove_metadata = self.b.dest.remove_metadata

        def removing_metadata(t):
            data = self.b.vg.lvs.get(cl.LV)     # (a delete may remove it)
            if data is not None and all(lv.read(r) == 'zero'
                                        for r in self.uncopied()):
                data['complete'] = True
            return remove_metadata(t)
        test.mock_object(self.b.dest, 'remove_metadata',
                         side_effect=removing_metadata)

    def zero(self, path, ranges):
        super().zero(path, ranges)
        self.lv.zeroout(ranges)


@ddt.ddt
class ThinFinalizingTestCase(test.TestCase):
    """The abandon of a ``finalizing`` move into a thin pool.

    What the user needs: every region the loss record lists reads
    zeroes afterwards (whatever the pool's zeroing: a pool with
    skip_block_zeroing is never trusted), every region copied keeps its
    data, and the pool's allocation does not grow for regions that are
    lost (an unprovisioned block reads zeroes already).
    """

    def stuck(self, lv, hydrated, thin_map=False):
        h = ThinHarness(self, lv, hydrated, reboot=True, thin_map=thin_map)
        self.assertEqual('thin', h.b.dest.lvm_type)
        h.b.vg.lvs[cl.LV]['complete'] = not h.uncopied()
        h.c.set_state(h.t, move.FINALIZING)
        h.lose_a()
        h.c.restart(h.b)
        self.assertFalse(h.b.dm.exists(cl.HANDLE))
        return h

    def assert_thin_outcome(self, h, lv, copied, before):
        self.assertEqual([], h.c.violations)
        self.assertIsNone(h.c.transfer())
        lost = tls._regions(h.expected_ranges())
        # (Only lost regions are written; those a thin LV does not map
        # read zeroes without.)
        self.assertEqual(set(), tls._regions(h.zeroed) - lost)
        self.assertEqual([], [r for r in sorted(lost)
                              if lv.read(r) != 'zero'][:5])
        self.assertEqual([], [r for r in sorted(copied - lost)
                              if lv.read(r) != 'data'][:5])
        grown = lv.provisioned - before
        self.assertEqual(set(), grown, '%d pool blocks provisioned for '
                         'regions never copied' % len(grown))

    # Control: relies on the scan over the stand-in finding no region
    # missing (the metadata LV committed all): nothing zeroed, nothing
    # provisioned; the regions thin map discarded (never copied, never
    # provisioned) stay unprovisioned and read zeroes.
    def test_every_region_committed_thin_mapped(self):
        lv = ThinLV()
        h = self.stuck(lv, range(REGIONS), thin_map=True)
        copied = h.c.source_regions(cl.REGION)
        lv.write(copied)
        before = set(lv.provisioned)
        outcome = h.run()
        self.assertEqual(0, outcome.uncopied_regions)
        self.assert_thin_outcome(h, lv, copied, before)
        self.assertEqual(len(copied), len(lv.provisioned))

    # Control: relies on the command zeroing the regions the metadata
    # LV never committed by writing zeroes (BLKZEROOUT): they held the
    # copy node B made before it lost power, now read zeroes as the
    # loss record says; being provisioned already, nothing grows.
    @ddt.data((1, True), (2, True), (2, False))
    @ddt.unpack
    def test_regions_not_committed(self, block_regions, zeroing):
        lv = ThinLV(block_regions, zeroing)
        not_committed = {8090, 8091, 8099}
        h = self.stuck(lv, set(range(REGIONS)) - not_committed)
        h.b.pool.zeroing = zeroing
        copied = set(range(REGIONS))            # copied, not committed
        lv.write(copied)
        before = set(lv.provisioned)
        outcome = h.run()
        self.assertEqual(3, outcome.uncopied_regions)
        self.assert_thin_outcome(h, lv, copied, before)

    # Control: relies on writing zeroes, not on discards nor on the
    # pool's zeroing.  A pool with skip_block_zeroing and blocks of two
    # regions: region 4001's copy was never committed, its block shares
    # region 4000 (copied, committed).  A discard of region 4001 alone
    # is a partial block, which dm-thin leaves as it is.
    def test_partial_block_in_a_pool_that_does_not_zero(self):
        lv = ThinLV(block_regions=2, zeroing=False)
        h = self.stuck(lv, set(range(REGIONS)) - {4001})
        h.b.pool.zeroing = False
        copied = set(range(REGIONS))
        lv.write(copied)
        before = set(lv.provisioned)
        h.run()
        self.assert_thin_outcome(h, lv, copied, before)
        self.assertEqual('data', lv.read(4000))


class ThinHydratingTestCase(test.TestCase):
    """The abandon of a ``hydrating`` move into a thin pool (no map)."""

    # Was MEDIUM (capacity: the pool's allocation jumped; no data lost
    # or leaked by itself), expectedFailure until the fix.  Sequence: a
    # 1 GiB volume moves into node B's thin pool (dmclone_thin_map off,
    # or a source still in use: every region is to be copied); 100 of
    # its 16384 regions are copied (provisioned) when node A is lost
    # for good; the operator runs abandon-source.  It zeroed the 16284
    # regions never copied by writing zeroes (BLKZEROOUT, no discard),
    # which on a thin LV provisions every one of them: the whole
    # virtual size, although an unprovisioned block reads zeroes
    # already.  A thin volume of 1 TiB abandoned early took ~1 TiB of
    # the pool in one command; in an over-committed pool that can fill
    # it, and a full pool stops the writes of every thin volume of the
    # node.  Now (LostSource._zero) only the parts in blocks the LV
    # maps are written, in a pool that zeroes new blocks.
    def test_the_regions_never_copied_stay_unprovisioned(self):
        lv = ThinLV()
        h = ThinHarness(self, lv, range(100))
        copied = set(range(100))
        lv.write(copied)
        before = set(lv.provisioned)
        h.lose_a()
        outcome = h.run()
        self.assertEqual(REGIONS - 100, outcome.uncopied_regions)
        ThinFinalizingTestCase.assert_thin_outcome(self, h, lv, copied,
                                                   before)

    # Control: relies on LostSource._zero writing the parts of lost
    # regions in blocks the LV maps.  Blocks of two regions: region 101
    # was never copied (not hydrated) but shares block 50 with region
    # 100, which was; and it holds what dm-clone copied there without
    # committing it (a power loss), as region 7001 does in a block of
    # lost regions.  They must read zeroes, as the loss record says, and
    # nothing else is provisioned.
    def test_lost_parts_of_mapped_blocks_are_zeroed(self):
        lv = ThinLV(block_regions=2)
        h = ThinHarness(self, lv, range(101))
        copied = set(range(101))
        lv.write(copied | {101, 7001})
        before = set(lv.provisioned)
        h.lose_a()
        outcome = h.run()
        self.assertEqual(REGIONS - 101, outcome.uncopied_regions)
        ThinFinalizingTestCase.assert_thin_outcome(self, h, lv, copied,
                                                   before)
        # (Region 7000 shares 7001's block: zeroed too, nothing taken.)
        self.assertEqual({101, 7000, 7001}, tls._regions(h.zeroed))

    # Control: relies on ThinMaps.zeroing_map answering None for a pool
    # with skip_block_zeroing.  There a block a later write maps holds
    # whatever it held before, so an unmapped lost region is no promise
    # of zeroes: every lost range is written, as on a thick LV.
    def test_a_pool_that_does_not_zero_gets_every_lost_range_written(self):
        lv = ThinLV(zeroing=False)
        h = ThinHarness(self, lv, range(100))
        lv.write(set(range(100)))
        h.lose_a()
        outcome = h.run()
        lost = tls._regions(h.expected_ranges())
        self.assertEqual(REGIONS - 100, outcome.uncopied_regions)
        self.assertEqual(lost, tls._regions(h.zeroed))
        self.assertEqual([], [r for r in sorted(lost)
                              if lv.read(r) != 'zero'][:5])

    # Control: relies on the map being read when the zeroing runs, not
    # before the fencing.  A map that cannot be read (thin_dump fails)
    # means every lost range is written: slower and larger, never a
    # region left unzeroed.
    def test_no_map_means_every_lost_range_is_written(self):
        lv = ThinLV()
        h = ThinHarness(self, lv, range(100))
        lv.write(set(range(100)))
        h.b.pool.fail_on['thin_dump'] = processutils.ProcessExecutionError(
            exit_code=1, stderr='bad superblock')
        h.lose_a()
        h.run()
        self.assertEqual(tls._regions(h.expected_ranges()),
                         tls._regions(h.zeroed))
        self.assertFalse(h.b.pool.held)

    # Control: a run that crashed in its zeroing (the loss recorded, not
    # marked zeroed), then run again: the second run reads the map again
    # and the lost regions end up zeroed, with nothing provisioned.
    def test_a_run_cut_short_while_zeroing_then_again(self):
        lv = ThinLV(block_regions=2)
        h = ThinHarness(self, lv, range(101))
        copied = set(range(101))
        lv.write(copied | {101})
        before = set(lv.provisioned)
        h.lose_a()
        h.arm_crash(('harness', 'zero', None), None)
        self.assertRaises(cl.Crash, h.run)
        self.assertEqual([], h.c.violations)
        h.run()
        ThinFinalizingTestCase.assert_thin_outcome(self, h, lv, copied,
                                                   before)
