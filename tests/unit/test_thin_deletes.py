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

"""Deletes and abandons on thin pools, around other events (two nodes).

1. A delete (Cinder's API, then the volume manager on node B, then the
   driver's own code) requested while ``cinder-dmclone move
   abandon-source`` runs over a volume hydrating into node B's thin
   pool, at every step of the command and while it holds the pool's
   metadata snapshot.  What a user and an operator need: the delete
   waits for the volume's lock (or is refused, saying why), nothing is
   zeroed once the LV is gone, the pool keeps no metadata snapshot and
   this service no record of one, and in the end the volume is deleted
   with nothing of it left on node B.
2. The abandon of a multiattach volume (moved by a migration, then
   attached by two instances on node B) hydrating into a thin pool:
   both attachments keep what was copied, the rest reads zeroes, the
   pool does not grow, and the volume can be detached and deleted.
3. Node B's start removing the clone of a volume deleted while it was
   down, on a thin pool, with the driver's own choice of wipe: no
   zeroes written into the thin LV (they would allocate all of it: the
   pool hands out zeroed blocks, so removing it is enough), and nothing
   removed while a live volume (by its ``_name_id``) names the LV.
4. A multiattach volume (it moves only by a migration) deleted while
   its move's destination is down: before the move was committed (the
   source gave it up) and after.

A waiting delete runs in a greenlet of its own (:class:`VolumeLocks`):
it waits exactly where the code asks for the volume's lock, so a delete
that did not ask for it would run in the middle of the command.
"""

import functools
import types
from unittest import mock

import ddt
import greenlet
import oslo_messaging

from cinder import exception
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import test

from cinder_dmclone import destination
from cinder_dmclone import driver
from cinder_dmclone import lost_source
from cinder_dmclone import move
from tests.harness import fake_cluster as cl
from tests.unit import test_abandon_races as tar
from tests.unit import test_deleted_clone
from tests.unit import test_lost_source as tls
from tests.unit import test_two_nodes

VID = cl.VOLUME_ID
REGIONS = tls.REGIONS
ATTACHED = fields.VolumeAttachStatus.ATTACHED


class VolumeLocks(object):
    """``move.lock`` for a test whose callers may wait (greenlets).

    A caller :meth:`start` ran that asks for a lock someone holds hands
    control back to whoever started it, and takes the lock when
    :meth:`finish` resumes it after the holder released it.  Any other
    caller (the command under test) never waits: a lock it finds held,
    or one a caller asks for twice, is a violation (it would
    deadlock).  Held names are in the cluster's ``held``, as its own
    locks keep them.
    """

    def __init__(self, test, c):
        self.c = c
        self.owners = {}
        self.runners = set()
        test.mock_object(move, 'lock', side_effect=self.lock)

    def lock(self, volume_id):
        return _Lock(self, 'dmclone-%s' % volume_id)

    def start(self, fn):
        """Run ``fn`` in a greenlet until it waits for a lock, or ends."""
        runner = greenlet.greenlet(fn)
        self.runners.add(runner)
        runner.switch()
        return runner

    @staticmethod
    def finish(runner):
        """Let a greenlet :meth:`start` ran go on to its end."""
        for _attempt in range(10):
            if runner.dead:
                return
            runner.switch()
        raise AssertionError('a caller still waits for a lock')


class _Lock(object):

    def __init__(self, locks, name):
        self.locks = locks
        self.name = name

    def acquire(self, blocking=True):
        locks = self.locks
        me = greenlet.getcurrent()
        while self.name in locks.owners:
            if not blocking:
                return False
            if locks.owners[self.name] is me or me not in locks.runners:
                locks.c.violation('lock %s would deadlock' % self.name)
                raise AssertionError('deadlock on %s' % self.name)
            me.parent.switch()
        locks.owners[self.name] = me
        locks.c.held.add(self.name)
        return True

    def release(self):
        self.locks.owners.pop(self.name, None)
        self.locks.c.held.discard(self.name)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class Delete(object):
    """Cinder's delete: the API's checks, then the volume manager's call.

    ``request``: cinder.volume.api.API.delete: only a volume in one of
    DELETABLE and not attached, set ``deleting`` at once (else
    InvalidVolume, nothing done).  ``serve``: VolumeManager.delete_volume
    on the node the record names, the driver's delete
    (:meth:`Cluster.delete <tests.harness.fake_cluster.Cluster.delete>`:
    ``error_deleting`` on an error, which it returns).  A volume in
    ``error_deleting`` is deleted again only after an admin's
    ``cinder reset-state``.
    """

    #: the statuses Cinder's API deletes a volume in (volume/api.py)
    DELETABLE = ('available', 'error', 'error_restoring', 'error_extending',
                 'error_managing')

    def __init__(self, c):
        self.c = c

    def request(self):
        rec = self.c.db.volumes[self.c.volume_id]
        status = rec.get('status', 'available')
        if status not in self.DELETABLE or any(
                a['attach_status'] == ATTACHED for a in self.c.attachments):
            raise exception.InvalidVolume(
                reason='Volume status must be available or error or '
                       'error_restoring or error_extending or error_managing '
                       'and must not be migrating, attached, ...; current '
                       'status is: %s.' % status)
        rec['status'] = 'deleting'

    def serve(self):
        try:
            self.c.delete()
        except Exception as exc:
            return exc
        return None

    def __call__(self):
        self.request()
        return self.serve()


class DeleteHarness(tar.ThinHarness):
    """ThinHarness whose zeroing also checks that the LV is still there.

    (After the command's own step: a hook there may have run a delete.)
    """

    def zero(self, path, ranges):
        super().zero(path, ranges)
        if cl.LV not in self.b.vg.lvs:
            self.c.violation('zeroed %d ranges of %s after the LV was '
                             'removed' % (len(ranges), path))


def at_the_dump(test, h, fn):
    """Run ``fn()`` once, as node B's pool is dumped (snapshot held)."""
    pool = h.b.pool
    run = pool.run
    record = {'fired': False}

    def running(cmd, *args, **kwargs):
        if not record['fired'] and tuple(cmd[:1]) == ('thin_dump',):
            test.assertTrue(pool.held)
            record['fired'] = True
            fn()
        return run(cmd, *args, **kwargs)
    test.mock_object(pool, 'run', side_effect=running)
    return record


@ddt.ddt
class DeleteDuringThinAbandonTestCase(test.TestCase):
    """A delete requested while the abandon runs over a thin LV.

    The volume hydrates into node B's thin pool (blocks of two regions),
    its instance is gone (detached, ``available``), node A is lost for
    good; the operator runs the command and the owner deletes the
    volume meanwhile.  Regions 101 and 7001 hold what node B copied
    without committing it: they are in mapped blocks, so the command
    writes zeroes there (and in their block mates 100 and 7000).
    """

    def setUp(self):
        super().setUp()
        self.lv = tar.ThinLV(block_regions=2)
        h = self.h = DeleteHarness(self, self.lv, range(101))
        self.lv.write(set(range(101)) | {101, 7001})
        h.c.attachments[:] = []
        h.lose_a()
        self.locks = VolumeLocks(self, h.c)
        self.cinder = Delete(h.c)
        self.log = self.mock_object(destination.LOG, 'error')

    def delete_during(self, fire_at):
        """The delete requested when ``fire_at(fn)`` runs ``fn``.

        The API accepts it at once (the volume is ``available``, or
        ``error`` once the command set it); the manager's call runs at
        once too, until it waits for the volume's lock.  Returns what
        the served delete returned (None: deleted).
        """
        h = self.h
        asked = {}

        def served():
            asked['error'] = self.cinder.serve()

        def requested():
            self.cinder.request()
            asked['runner'] = self.locks.start(served)
        fired = fire_at(requested)
        try:
            h.run()
        except lost_source.Refused as exc:
            # (the command found the volume 'deleting' at its end)
            self.assertIn('status changed while the command ran', str(exc))
        finally:
            if 'runner' in asked:
                self.locks.finish(asked['runner'])
        self.assertTrue(fired['fired'])
        # (the command released the pool's snapshot before it returned)
        self.assertEqual([], h.c.violations)
        h.c.assert_no_snapshot_held()
        return asked['error']

    def assert_deleted_in_the_end(self, error):
        """What the user and the operator see, and do next.

        A failed delete says what to do (the source is lost: run the
        command, with the volume in error); done, the next delete
        deletes.  Nothing of the volume stays on node B, its pool holds
        no metadata snapshot, this service keeps no record of one, and
        only regions never copied were ever zeroed, while the LV was
        there.
        """
        h = self.h
        c = h.c
        self.assertEqual([], c.violations)
        if error is not None:
            self.assertEqual('error_deleting', c.db.volumes[VID]['status'])
            self.assertIsNotNone(self.log.call_args, repr(error))
            text = self.log.call_args[0][0] % self.log.call_args[0][1]
            self.assertIn('cinder-dmclone move abandon-source %s' % VID,
                          text)
            c.db.volumes[VID]['status'] = 'error'       # reset-state
        if c.transfer() is not None:
            h.run()
            self.assertIsNone(c.transfer())
        if not c.deleted:
            self.assertIsNone(self.cinder())
        self.assertEqual([], c.violations)
        c.assert_no_transfer()
        self.assertEqual({}, h.b.vg.lvs)
        self.assertEqual({}, h.b.dm.devices)
        self.assertEqual({}, h.b.connector.sessions)
        c.assert_no_snapshot_held()
        self.assertEqual(set(), tls._regions(h.zeroed) - tls._regions(
            h.expected_ranges()))

    # Control: relies on Destination.delete taking the volume's lock
    # before it removes anything (it waits for the command), and on the
    # command's conditional status update (expected SETTLED: 'deleting'
    # is not, so it refuses to clear the move).  The delete then finds
    # the move source_lost, removes node B's side, cannot retire the
    # lost source's copy and fails, naming the command; run again (the
    # volume reset to error) the command ends the move without data
    # (LostSource._end_without_data) and the next delete deletes.
    @ddt.data(*range(len(tls.STEPS)))
    def test_delete_during_the_abandon(self, step):
        error = self.delete_during(functools.partial(
            tar.hook_at, self, self.h, tls.STEPS[step]))
        self.assert_deleted_in_the_end(error)

    # Control: the delete comes while the command holds node B's pool
    # metadata snapshot (its zeroing reads what the LV maps): it waits,
    # the snapshot is released and its record removed whatever follows.
    def test_delete_while_the_pool_is_dumped(self):
        error = self.delete_during(functools.partial(at_the_dump, self,
                                                     self.h))
        self.assertIsNotNone(error)
        self.assert_deleted_in_the_end(error)
        # (region 101's block was mapped: zeroed, while the LV was there)
        self.assertIn(101, tls._regions(self.h.zeroed))

    # The command is killed while it holds node B's pool metadata
    # snapshot (an operator's session cut as it releases it: no
    # ``finally`` of its own runs after that), then the owner deletes
    # the volume: the delete fails, naming the command; the operator
    # runs it again, which finds the LV gone and ends the move without
    # reading any map, and deletes the volume.  A snapshot left held
    # keeps every block it references allocated (the deleted LV's data
    # too) and this node's record of it names it this service's
    # leftover: the command's next run must release it, as the
    # service's start does, whatever path that run takes.
    def test_a_run_killed_holding_the_snapshot_then_a_delete(self):
        h = self.h
        pool = h.b.pool
        run = pool.run
        killed = []

        def running(cmd, *args, **kwargs):
            if not killed and tuple(cmd[-1:]) == ('release_metadata_snap',):
                killed.append(cmd)
                raise cl.Crash('killed while releasing the snapshot')
            return run(cmd, *args, **kwargs)
        self.mock_object(pool, 'run', side_effect=running)
        self.assertRaises(cl.Crash, h.run)
        self.assertTrue(pool.held)
        self.assertEqual([pool.pool], h.b.thin_maps().recorded_pools())
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        error = self.cinder()
        self.assertIsNotNone(error)
        self.assertNotIn(cl.LV, h.b.vg.lvs)
        self.assert_deleted_in_the_end(error)


class MultiattachHarness(tar.ThinHarness):
    """ThinHarness of a multiattach volume, attached twice on node B.

    A multiattach volume never moves on an attach: an admin migrated it
    to node B (detached), then two instances attached it there while it
    hydrates.  (dmclone_thin_map off: every region is to be copied.)
    """

    def __init__(self, test, lv, hydrated):
        attach = cl.Cluster.attach

        def migrate_then_attach_twice(c, node):
            c.multiattach = True
            test.assertTrue(c.migrate(node))
            for instance in (fake.INSTANCE_ID, test_two_nodes.INSTANCE2_ID):
                attach(c, node, instance_uuid=instance)
            c.db.volumes[c.volume_id]['status'] = 'in-use'
        with mock.patch.object(cl.Cluster, 'attach',
                               migrate_then_attach_twice):
            super().__init__(test, lv, hydrated)


class MultiattachThinAbandonTestCase(test.TestCase):
    """The abandon of a multiattach volume hydrating into a thin pool."""

    # Control: relies on the command keeping the handle (both
    # attachments' device) and swapping tables under it, and on
    # LostSource._zero writing only the lost parts of mapped blocks.
    # What the users need: both instances keep every region copied,
    # the regions never copied read zeroes, the pool does not grow for
    # them, the loss shows ('error'), and afterwards each instance
    # detaches and the owner deletes the volume, leaving nothing.
    def test_both_attachments_keep_the_copied_data(self):
        lv = tar.ThinLV(block_regions=2)
        h = MultiattachHarness(self, lv, range(101))
        self.assertTrue(h.c.volume().multiattach)
        self.assertEqual(2, len(h.c.attachments))
        copied = set(range(101))
        lv.write(copied | {101})
        before = set(lv.provisioned)
        h.lose_a()
        outcome = h.run()
        self.assertEqual(REGIONS - 101, outcome.uncopied_regions)
        tar.ThinFinalizingTestCase.assert_thin_outcome(self, h, lv, copied,
                                                       before)
        self.assertEqual({cl.HANDLE: tls.LINEAR}, h.b.dm.devices)
        self.assertEqual([(ATTACHED, 'node-b')] * 2,
                         [(a['attach_status'], a['attached_host'])
                          for a in h.c.attachments])
        rec = h.c.db.volumes[VID]
        self.assertEqual(('error', h.b.host), (rec['status'], rec['host']))
        h.c.assert_no_snapshot_held()
        for att in list(h.c.attachments):
            h.c.detach(att)
        self.assertIsNone(Delete(h.c)())
        self.assertEqual([], h.c.violations)
        self.assertEqual({}, h.b.vg.lvs)
        self.assertEqual({}, h.b.dm.devices)


class ThinBackend(object):
    """What DMCloneVolumeDriver reads to build a node's Wiper: thin LVs.

    ``volume_clear = zero``, as Cinder's default; the driver's own
    choice of wipe (:meth:`DMCloneVolumeDriver._needs_wipe`) decides.
    """

    wiper = driver.DMCloneVolumeDriver.wiper
    _needs_wipe = driver.DMCloneVolumeDriver._needs_wipe
    _wipe = driver.DMCloneVolumeDriver._wipe

    def __init__(self, vg, dm, lv_names):
        self.vg = vg
        self.dm = dm
        self._wiper = None
        self._data_lv_names = lv_names
        self.configuration = types.SimpleNamespace(
            lvm_type='thin', volume_clear='zero', volume_clear_size=0,
            volume_clear_ionice=None)


class ThinStartWipeTestCase(test_two_nodes.ClusterTestCase):
    """Node B's start removes a deleted volume's clone from a thin pool.

    test_deleted_clone's scenario (test_review24 finding 2: move 1 given
    up while node B was down, then the volume deleted) on thin pools,
    each node's Wiper built as the driver builds it.  Writing zeroes
    into a thin LV (Cinder's volume_clear) allocates every block of it:
    a 1 TiB clone takes 1 TiB of the pool, which can fill it and stop
    every thin LV of the node.  The pool hands out zeroed blocks, so
    removing the LV is all a thin LV needs.
    """

    def setUp(self):
        super().setUp()
        #: (path, MiB) of every volume_utils.clear_volume: zero writes
        self.zero_writes = []
        self.mock_object(driver.volume_utils, 'clear_volume',
                         side_effect=lambda mb, path, **kw:
                         self.zero_writes.append((path, mb)))
        self.mock_object(cl, 'wiper', types.SimpleNamespace(
            Wiper=self.driver_wiper))
        self.c = cl.Cluster(self, thin=True)
        self.a = self.c.a
        self.b = self.c.b
        self.t = test_deleted_clone.given_up_then_deleted(self)
        self.assertEqual('thin', self.b.dest.lvm_type)

    @staticmethod
    def driver_wiper(vg, dm, wipe=None, spawn=None, lv_names=None):
        """The node's Wiper, made by the driver's code (run at once)."""
        made = ThinBackend(vg, dm, lv_names).wiper
        made._spawn = spawn
        return made

    def start_b(self):
        self.b.restart()
        self.b.recover()
        self.c.now += 3600
        self.c.settle()

    def assert_nothing_written(self):
        self.assertEqual([], self.zero_writes)
        self.assertEqual([], [cmd for cmd in self.b.executed
                              if cmd[2] in ('dd', 'shred')
                              and any(cl.LV + '-dmcmeta' not in arg
                                      and cl.LV in arg for arg in cmd)])

    # Control: relies on the driver's wiper taking no wipe for thin LVs
    # (_needs_wipe) and on Recovery._drop_deleted tearing the clone
    # down through it: the LV removed, its blocks back in the pool.
    def test_the_clone_goes_without_zeroes_written(self):
        self.start_b()
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertIsNone(self.b.part_marks.read(VID))
        self.assert_nothing_written()

    # Control: relies on recovery's live-volume check (volume_of_lv in
    # _named_elsewhere): a volume whose _name_id names the LV uses it.
    def test_a_live_name_id_volume_keeps_its_lv(self):
        test_deleted_clone.DeletedCloneTestCase.add_volume(
            self, test_deleted_clone.OTHER_ID, _name_id=VID)
        self.assertEqual(cl.LV,
                         self.c.volume(test_deleted_clone.OTHER_ID).name)
        self.start_b()
        self.assertEqual([], self.c.violations)
        self.assertEqual({cl.LV, cl.META}, set(self.b.vg.lvs))
        self.assertIsNotNone(self.b.part_marks.read(VID))
        self.assert_nothing_written()


class MultiattachDestinationDownTestCase(test_two_nodes.ClusterTestCase):
    """A multiattach volume deleted while its move's destination is down.

    It moves only by a migration (detached).  What the owner needs: the
    delete leaves no copy of the tenant's data on either node, wiped
    before its space is reused, once node B is back; and while node B
    is down nothing node A holds is lost.
    """

    def setUp(self):
        super().setUp()
        self.c.multiattach = True

    def given_up_while_b_is_down(self):
        """node B built the migration's clone and died before answering.

        node A gives the move up (``aborted``: its abort cannot reach
        node B), and the migration fails.
        """
        self.c.restart_before_timeout = False
        fired = self.c.crash_at(self.b.destination, '_refuse_if_given_up',
                                when='after')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertTrue(fired['fired'])
        self.assertTrue(self.b.down)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertIn(cl.LV, self.b.vg.lvs)

    # Control: as test_review24's plain volume (Recovery._drop_deleted).
    def test_given_up_then_deleted_then_b_starts(self):
        self.given_up_while_b_is_down()
        self.assertIsNone(Delete(self.c)())
        destroy_row(self)
        self.assertEqual({}, self.a.vg.lvs)
        self.b.restart()
        self.b.recover()
        self.c.now += 3600
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertTrue(any('/%s-dmcwipe-' % cl.LV in p
                            for p in self.b.wiped), self.b.wiped)

    # Control: the migration committed (the record names node B, the
    # volume hydrates there), then node B loses power.  The delete,
    # routed to node B, fails (error_deleting) and node A keeps its
    # copy, which holds every region node B never got; node B back,
    # the delete again removes both copies, wiped.
    def test_committed_then_deleted_while_b_is_down(self):
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.b.reboot()
        self.b.down = True
        error = Delete(self.c)()
        self.assertIsInstance(error, oslo_messaging.MessagingTimeout)
        self.assertEqual('error_deleting',
                         self.c.db.volumes[VID]['status'])
        self.assertEqual([cl.LV], list(self.a.vg.lvs))
        self.assertEqual([], self.a.wiped)
        self.assertIsNotNone(self.c.transfer())
        self.c.restart(self.b)
        self.c.db.volumes[VID]['status'] = 'error'      # reset-state
        self.assertIsNone(Delete(self.c)())
        self.c.assert_deleted()
        self.assertTrue(any('/%s-dmcwipe-' % cl.LV in p
                            for p in self.a.wiped), self.a.wiped)
        self.assertTrue(any('/%s-dmcwipe-' % cl.LV in p
                            for p in self.b.wiped), self.b.wiped)


def destroy_row(test):
    """Cinder's delete finished: the volume's row is gone."""
    del test.c.db.volumes[VID]
    test.c.db.admin_metadata.pop(VID, None)
