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

"""Review 11 of the thin map (thin-next at d026a18): what it must not do.

Each test names its finding (R11-n).  A test that fails shows the
defect; see the review's report for the sequence and the fix it asks.
"""

import os
import threading

import fixtures
from oslo_db import exception as db_exc

from cinder import exception
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import test

from cinder_dmclone import peer
from cinder_dmclone import privileged
from cinder_dmclone import region_map
from cinder_dmclone import thin
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.unit import fakes
from tests.unit import test_two_nodes

RESERVED = fields.VolumeAttachStatus.RESERVED
ATTACHED = fields.VolumeAttachStatus.ATTACHED


class ThinMapRacesTestCase(test_two_nodes.ClusterTestCase):
    """A detached thin volume's move with the map, and what races it."""

    def setUp(self):
        super().setUp()
        self.c = fake_cluster.Cluster(self, thin=True, thin_map=True)
        self.a = self.c.a
        self.b = self.c.b

    def prepare_steps(self):
        return [call[2] for call in self.c.rpc.calls
                if call[2] and call[2]['op'] == peer.PREPARE]

    def local_attach_on_a_during(self, obj, attr):
        """Nova attaches the volume on node-a while ``obj.attr`` runs.

        Cinder reserves an attachment of an available volume whatever
        its ``migration_status`` (``_attachment_reserve`` checks only
        the status), and node-a's initialize_connection hands out the
        local path as long as no move is recorded yet; the attachment
        stays ``reserved`` until the manager's ``volume_attached``, after
        the driver returned.  Returns the attachment.
        """
        att = {'id': fake.ATTACHMENT2_ID, 'instance_uuid': fake.INSTANCE_ID,
               'attach_status': RESERVED, 'attached_host': None,
               'connector': None}
        original = getattr(obj, attr)

        def racing(*args, **kwargs):
            self.c.attachments.append(att)
            try:
                self.info = self.a.initialize_connection(
                    self.c.volume(), dict(self.a.props))
            except Exception as exc:
                self.info = exc
            return original(*args, **kwargs)
        self.mock_object(obj, attr, side_effect=racing)
        return att

    # R11-1 (HIGH): cinder migrate (the drain) races a local attach on
    # the source.  The driver's "no attachment" check reads the
    # manager's volume object; Source.move counts only ACTIVE
    # attachments (attached, attaching) on this node, not a RESERVED one
    # whose local path node-a has just handed out.  The move hydrates
    # at once and sends the map (the handle is not open yet: qemu opens
    # it only after Nova gets the connection info), node-b discards
    # every unmapped region and the volume record names node-b, while
    # the instance on node-a writes to the old LV: every write is lost
    # (and the LV is retired under it).
    def test_r11_1_migrate_racing_a_local_attach_must_not_hydrate(self):
        att = self.local_attach_on_a_during(self.a.source, '_record')
        self.c.migrate(self.b)
        # Since R12's open point b, the local attach is refused while the
        # migration is being started (Source._migration_starting); its
        # attachment, left reserved, still keeps the move from hydrating.
        self.assertIsInstance(self.info, exception.VolumeIsBusy)
        self.assertEqual(1, len(self.prepare_steps()))
        att.update(attach_status=ATTACHED, attached_host='node-a',
                   connector=dict(self.a.props))
        for step in self.prepare_steps():
            self.assertNotIn(peer.REGION_MAP, step,
                             'a map was taken of an LV just handed out '
                             'to an instance on node-a')
            self.assertFalse(step.get('hydrate'),
                             'node-b hydrates from an LV that an instance '
                             'on node-a is about to write')

    # R11-2 (MEDIUM): an attach elsewhere of a volume still
    # "downloading" (copy_image_to_volume on node-a: the image is
    # fetched to a temporary file first, then qemu-img writes it through
    # the handle resolved before).  Cinder reserves a "downloading"
    # volume (its FIXME in _attachment_reserve); nothing here refuses
    # the move, and the handle has no opener while the image downloads,
    # so the map says "empty": node-b discards every region, and the
    # image written afterwards on node-a is lost.
    def test_r11_2_no_map_of_a_volume_being_written_with_an_image(self):
        self.c.db.volumes[fake_cluster.VOLUME_ID]['status'] = 'downloading'
        try:
            self.c.attach(self.b)
        except Exception:
            pass        # refusing the move is a right answer too
        for step in self.prepare_steps():
            self.assertNotIn(peer.REGION_MAP, step,
                             'a map was taken while the image is still '
                             'to be written on node-a')

    # R11-3 (LOW): Clones.apply_map checks hydration, the hydrated count
    # and no_discard_passdown, but not that nothing has opened the new
    # clone: the comment "its path is not returned yet" is the only
    # guard.  udev's rules run on the new dm device (blkid; LVM
    # autoactivation or mdadm --incremental on what the tenant's data
    # looks like), and a writer there is race 2 of thin-map.rst.  The
    # harness's fake clone reports a discard on an open clone.
    def test_r11_3_map_discards_refused_on_an_open_clone(self):
        self.clone_opened_after_build()
        try:
            self.c.migrate(self.b)
        except Exception:
            pass        # refusing the map, or the move, is right
        self.assertEqual([], [v for v in self.c.violations
                              if 'while the clone is open' in v])

    # R11-4 (LOW): the map is taken after the move is recorded with its
    # budget (Side.stale_prepare_after: the transfer timeout plus a
    # margin) and before the prepare is sent, so the time of
    # ``thin_dump`` and of the wait for the pool's lock (moves of one
    # pool take their maps in turn: a drain) is not in the budget.  The
    # record of an attempt that is still running then looks outlived
    # (Side.prepare_outlived, "the only proof that no attempt will still
    # record the outcome").
    def test_r11_4_an_attempt_taking_its_map_is_not_outlived(self):
        take = self.a.source.thin_maps.take
        outlived = []

        def slow_take(lv, sectors, region):
            self.c.now += self.a.source.stale_prepare_after() + 1
            outlived.append(self.a.source.prepare_outlived(
                self.c.transfer()))
            return take(lv, sectors, region)
        self.mock_object(self.a.source.thin_maps, 'take',
                         side_effect=slow_take)
        try:
            moved = self.c.migrate(self.b)
        except Exception as exc:
            moved = exc     # (d026a18: MoveDeadlinePassed at the commit)
        self.assertEqual(([False], True), (outlived, moved))


class ThinMapsRecordTestCase(test.TestCase):
    """The reservation records of ThinMaps (region_map.py)."""

    VG = 'cinder-volumes'
    REGION = 128
    SECTORS = 2048

    def setUp(self):
        super().setUp()
        self.dir = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                'dmclone')
        self.pool = fakes.FakeThinPool(self.VG)
        self.pool.add('volume-1', [(0, 2)])
        self.pool.add('volume-2', [(5, 6)])
        self.nested = None

    @staticmethod
    def lock(vg, pool):
        # (Each service's own lock, as when the lock named the node: the
        # records alone must keep the two apart.)
        return threading.Lock()

    def maps(self, node, execute):
        return region_map.ThinMaps(node, self.VG, self.dir, execute=execute,
                                   root_helper='rw', lock=self.lock)

    # R11-5 (LOW): a record names the pool only (<state_path>/dmclone/
    # <vg>-<pool>-tpool.metasnap), the lock names the node as well
    # (move.pool_lock).  Two volume services of one host sharing a VG
    # under two node names (two backends with their own backend_host or
    # dmclone_node_name) take different locks and read each other's
    # live record as "a leftover of ours": the second releases the
    # first's snapshot while the first's thin_dump reads it (metadata
    # blocks the live pool may reuse: a dump of freed blocks), then the
    # first's release drops the second's.
    def test_r11_5_a_live_reservation_is_never_released_by_another(self):
        second = {}

        def execute(*cmd, **kwargs):
            cmd = cmd[len(privileged.ENV_PREFIX):]
            if cmd[0] == 'thin_dump' and self.nested is None:
                self.nested = True
                second['token'] = other.take('volume-2', self.SECTORS,
                                             self.REGION)
            return self.pool.run(cmd)
        first = self.maps('node-a', execute)
        other = self.maps('node-a.example.org', execute)
        token = first.take('volume-1', self.SECTORS, self.REGION)
        self.assertIsNotNone(token, 'the first map lost its snapshot to '
                             'the other service: %s' % self.pool.calls)
        self.assertEqual([(0, 2)], thin.decode_regions(
            token, self.SECTORS // self.REGION, self.REGION))


class ThinMapClusterTestCase(test_two_nodes.ClusterTestCase):
    """Two nodes with thin pools and the thin map on (no tests here)."""

    def setUp(self):
        super().setUp()
        self.c = fake_cluster.Cluster(self, thin=True, thin_map=True)
        self.a = self.c.a
        self.b = self.c.b

    def hydrating(self):
        return self.b.dm.status(HANDLE)[0].clone.hydration_enabled

    def assert_guarded(self, message=None, restart=False):
        """The pool stops zeroing: at the next tick, hydration stops.

        With ``restart``, node-b's service starts again (its recovery
        runs) before that tick.
        """
        self.b.pool.zeroing = False
        if restart:
            self.b.restart()
            self.b.recover()
        self.b.monitor.tick()
        self.assertFalse(self.hydrating(), message)

    def assert_guarded_then_completed(self, message=None, restart=False):
        """As :meth:`assert_guarded`; the pool zeroes again: it completes."""
        self.assert_guarded(message, restart)
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()


class ZeroingGuardAfterRestartTestCase(ThinMapClusterTestCase):
    """R11-6, open point: the pool-zeroing guard outlives a restart.

    A clone whose regions node-b marked copied by a thin map (discards)
    reads zeroes there only while node-b's pool zeroes new blocks; the
    monitor stops its hydration when the pool stops zeroing
    (Destination.guard_pool_zeroing).  That must hold after node-b's
    volume service restarts, and after node-b reboots, and must never
    touch a clone that was not mapped.
    """

    def mapped_in_record(self):
        """Whether the record says this move's clone was mapped."""
        return getattr(self.c.transfer(), 'thin_mapped', False)

    def restart_b(self, reboot=False):
        """node-b's volume service starts again (its recovery runs)."""
        if reboot:
            self.b.reboot()
        else:
            self.b.restart()
        self.b.recover()

    def errors(self):
        return str(self.log.error.call_args_list)

    # The defect: after a restart node-b's service no longer knew that
    # the clone was mapped, and let it hydrate in a pool that does not
    # zero.
    def test_a_restart_keeps_the_guard(self):
        self.assertTrue(self.c.migrate(self.b))
        self.restart_b()
        self.b.pool.zeroing = False
        self.log.reset_mock()
        self.b.monitor.tick()
        self.assertFalse(self.hydrating(), 'a mapped clone hydrates in '
                         'a pool that stopped zeroing after a restart')
        self.assertIn(self.b.pool.pool, self.errors())
        self.b.pool.zeroing = True
        self.b.monitor.tick()
        self.assertTrue(self.hydrating())
        self.c.settle()
        self.c.assert_completed()

    def test_the_start_applies_the_guard_before_any_tick(self):
        self.assertTrue(self.c.migrate(self.b))
        self.b.pool.zeroing = False
        self.restart_b()
        self.assertFalse(self.hydrating(), 'the start left a mapped clone '
                         'hydrating in a pool that does not zero')
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()

    def test_a_reboot_rebuilds_a_mapped_clone_without_hydration(self):
        self.assertTrue(self.c.migrate(self.b))
        self.b.pool.zeroing = False
        self.log.reset_mock()
        self.restart_b(reboot=True)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertFalse(self.hydrating(), 'a mapped clone was rebuilt '
                         'hydrating in a pool that does not zero')
        self.assertIn(self.b.pool.pool, self.errors())
        self.b.monitor.tick()
        self.assertFalse(self.hydrating())
        self.b.pool.zeroing = True
        self.b.monitor.tick()
        self.assertTrue(self.hydrating())
        self.c.settle()
        self.c.assert_completed()

    def test_a_move_never_mapped_keeps_hydrating_after_a_restart(self):
        # (A pool that did not zero at the prepare: every region copied.
        # Its thin LVs cannot discard either, so dm-clone reports
        # no_discard_passdown by itself: that is no sign of a map.)
        self.b.pool.zeroing = False
        self.b.dm.cannot_discard = True
        self.assertTrue(self.c.migrate(self.b))
        self.assertIn('no_discard_passdown',
                      self.b.dm.status(HANDLE)[0].clone.features)
        self.assertFalse(self.mapped_in_record())
        for reboot in (False, True):
            self.restart_b(reboot=reboot)
            self.b.monitor.tick()
            self.assertTrue(self.hydrating(), 'reboot=%s' % reboot)
        self.assertNotIn('zeroes new blocks', self.errors())
        self.c.settle()
        self.c.assert_completed()

    def test_the_mark_is_recorded_before_the_first_discard(self):
        seen = []
        discard = self.b.dm.discard

        def recording_discard(name, start, sectors):
            seen.append(self.mapped_in_record())
            return discard(name, start, sectors)
        self.b.dm.discard = recording_discard
        self.assertTrue(self.c.migrate(self.b))
        self.assertNotEqual([], seen)
        self.assertEqual([True], sorted(set(seen)),
                         'a discard ran before the record said so')
        self.assertTrue(self.mapped_in_record())
        self.c.settle()
        self.c.assert_completed()
        self.assertEqual({}, self.c.transfer_keys())

    def test_a_crash_between_the_mark_and_the_discards(self):
        # node-b dies after the mark, before any discard: the move is
        # given up, the mark goes with it; the next move of the volume
        # (another secret) is mapped and guarded as its own.
        crash = self.c.crash_at(self.b.dest, 'apply_map')
        first = []
        save = self.a.store.save

        def saving(ctxt, t, *args, **kwargs):
            save(ctxt, t, *args, **kwargs)
            first.append(t.secret)
        self.mock_object(self.a.store, 'save', side_effect=saving)
        try:
            self.c.migrate(self.b)
        except Exception:
            pass
        self.assertTrue(crash['fired'])
        self.c.settle()
        self.c.restart(self.a)
        self.c.assert_rolled_back()
        self.assertEqual({}, self.c.transfer_keys())
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(2, len(set(first)))
        self.assertTrue(self.mapped_in_record())
        self.restart_b()
        self.assert_guarded_then_completed()

    def test_a_mark_left_by_an_earlier_move_guards_no_later_one(self):
        # A clear cut short leaves keys without a state; a later move of
        # the volume, copied whole (node-b's pool did not zero at its
        # prepare), must not be taken for mapped by such a key.
        marks = {}
        discard = self.b.dm.discard

        def remembering(name, start, sectors):
            marks.update(self.c.transfer_keys())
            return discard(name, start, sectors)
        self.b.dm.discard = remembering
        crash = self.c.crash_at(self.b.dest, 'enable_hydration')
        try:
            self.c.migrate(self.b)
        except Exception:
            pass
        self.assertTrue(crash['fired'])
        self.c.settle()
        self.c.restart(self.a)
        self.c.assert_rolled_back()
        self.b.pool.zeroing = False
        self.assertTrue(self.c.migrate(self.b))
        later = self.c.transfer_keys()
        stale = {k: v for k, v in marks.items() if k not in later}
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, self.c.volume_id, stale, False)
        self.assertFalse(self.mapped_in_record())
        self.restart_b()
        self.b.monitor.tick()
        self.assertTrue(self.hydrating())
        self.c.settle()
        self.c.assert_completed()

    def test_a_name_id_volume_keeps_the_guard_after_a_restart(self):
        volume_id = self.name_id_volume()
        self.assertNotEqual('volume-%s' % volume_id, LV)
        self.assertTrue(self.c.migrate(self.b))
        self.restart_b()
        self.assert_guarded_then_completed()

    def test_a_given_up_move_leaves_no_mark(self):
        # (The pool stopped zeroing while the map was applied: the move
        # is given up after its discards.)
        self.zeroing_off_after_the_map()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.c.settle()
        self.c.restart(self.a)
        self.c.assert_rolled_back()
        self.assertEqual({}, self.c.transfer_keys())

    def test_a_mark_that_cannot_be_written_gives_the_move_up(self):
        # (The database refuses the write: no discard without the mark.)
        self.mock_object(self.b.store, 'mark_thin_mapped',
                         side_effect=db_exc.DBError('db gone'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertEqual({}, self.b.dm.discarded)
        self.c.settle()
        self.c.restart(self.a)
        self.c.assert_rolled_back()
        self.assertEqual({}, self.c.transfer_keys())

    def test_no_mark_when_nothing_was_discarded(self):
        # (udev opened the new clone: no region is discarded, every one
        # is copied, and the clone needs no guard.)
        self.clone_opened_after_build()
        self.assertTrue(self.c.migrate(self.b))
        self.b.dm.openers.pop(HANDLE)
        self.assertEqual({}, self.b.dm.discarded)
        self.assertFalse(self.mapped_in_record())
        self.b.pool.zeroing = False
        self.restart_b()
        self.b.monitor.tick()
        self.assertTrue(self.hydrating())
        self.c.settle()
        self.c.assert_completed()
