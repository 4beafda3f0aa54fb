# Copyright 2026 The cinder-dmclone authors.
#
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

"""Review 14: the restart-guard (dmclone_thin_mapped) and races merges."""

from cinder import context
from cinder import exception
from cinder.tests.unit import test
from tooz import coordination as tooz_coordination

from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.unit import fakes
from tests.unit import test_driver
from tests.unit import test_move
from tests.unit import test_review11

VOLUME_ID = test_move.VOLUME_ID
MARK = move.KEY_PREFIX + move.THIN_MAPPED


def is_mark(key):
    """A thin-mapped mark's key: the old single key or one per move."""
    return key.startswith(MARK)


class StaleWholeRecordWriteTestCase(test_review11.ThinMapClusterTestCase):
    """R14-1: Cinder rewrites admin metadata whole, from a stale copy.

    ``Volume.begin_attach`` (the manager's ``attach_volume``, reached by
    the owner's legacy ``os-attach`` action) sets ``attached_mode`` in
    the volume object's admin_metadata and saves it: ``Volume.save``
    writes the *whole* dict with ``delete=True``.  That dict was read by
    the API (``update_volume_admin_metadata``) before the RPC: any key
    written in between -- the destination's ``dmclone_thin_mapped`` --
    is deleted.  The guard then reads the record each tick: it is off at
    once, not only after a restart (before the merge the running service
    kept it in memory).  (Fixed: the running service remembers the
    clones it mapped, and after a restart the destination's own mark on
    its node counts: see NodeMarkTestCase.)
    """

    def migrate_with_a_legacy_attach_in_flight(self):
        stale = {}
        mark = self.b.store.mark_thin_mapped

        def api_reads_then_mark(ctxt, t):
            # The API read the admin metadata (os-attach) before it.
            stale.update(self.c.db.volume_admin_metadata_get(
                ctxt, t.volume_id))
            return mark(ctxt, t)
        self.mock_object(self.b.store, 'mark_thin_mapped',
                         side_effect=api_reads_then_mark)
        discard = self.b.dm.discard
        saved = []

        def manager_saves_then_discard(name, start, sectors):
            if not saved:
                # manager.attach_volume -> Volume.begin_attach -> save()
                md = dict(stale, attached_mode='rw')
                self.c.db.volume_admin_metadata_update(
                    self.c.ctxt, self.c.volume_id, md, True)
                saved.append(True)
            return discard(name, start, sectors)
        self.b.dm.discard = manager_saves_then_discard
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual([True], saved)
        self.assertNotEqual({}, self.b.dm.discarded)

    def test_guard_lost_at_once_after_a_stale_save(self):
        self.migrate_with_a_legacy_attach_in_flight()
        self.assert_guarded('R14-1: a mapped clone hydrates in a pool that '
                            'stopped zeroing: the mark was dropped by a '
                            'stale whole-dict admin metadata save')

    def test_guard_lost_after_a_restart_after_a_stale_save(self):
        self.migrate_with_a_legacy_attach_in_flight()
        self.assert_guarded('R14-1: after a restart a mapped clone hydrates '
                            'in a pool that does not zero', restart=True)

    def test_the_node_mark_guards_after_a_stale_save_and_a_reboot(self):
        self.migrate_with_a_legacy_attach_in_flight()
        self.assertFalse(self.c.transfer().thin_mapped)
        self.b.pool.zeroing = False
        self.b.reboot()
        self.b.recover()
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertFalse(self.hydrating(), 'a mapped clone was rebuilt '
                         'hydrating in a pool that does not zero')
        self.b.monitor.tick()
        self.assertFalse(self.hydrating())
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()
        # (The move's end takes the node's mark with it.)
        self.assertIsNone(self.b.marks.read(self.c.volume_id))


class NodeMarkTestCase(test_review11.ThinMapClusterTestCase):
    """R14-1: the destination's own durable mark, beside the record's."""

    def tag(self):
        return move.thin_map_tag(self.c.transfer().secret)

    def node_mark(self):
        return self.b.marks.read(self.c.volume_id)

    def test_written_before_the_first_discard(self):
        seen = []
        discard = self.b.dm.discard

        def recording_discard(name, start, sectors):
            seen.append(self.node_mark() == self.tag())
            return discard(name, start, sectors)
        self.b.dm.discard = recording_discard
        self.assertTrue(self.c.migrate(self.b))
        self.assertNotEqual([], seen)
        self.assertEqual([True], sorted(set(seen)),
                         'a discard ran before this node marked the clone')
        self.assertEqual(self.tag(), self.node_mark())

    def test_a_mark_that_cannot_be_written_gives_the_move_up(self):
        self.mock_object(self.b.marks, 'write',
                         side_effect=OSError(28, 'No space left on device'))
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('could not be recorded', str(exc))
        self.assertEqual({}, self.b.dm.discarded)
        self.c.settle()
        self.c.restart(self.a)
        self.c.assert_rolled_back()
        self.assertEqual({}, self.c.transfer_keys())
        self.assertIsNone(self.node_mark())

    def test_gone_at_the_moves_end(self):
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(self.tag(), self.node_mark())
        self.c.settle()
        self.c.assert_completed()
        self.assertIsNone(self.node_mark())

    def test_gone_when_nothing_was_discarded(self):
        self.clone_opened_after_build()
        self.assertTrue(self.c.migrate(self.b))
        self.b.dm.openers.pop(HANDLE)
        self.assertEqual({}, self.b.dm.discarded)
        self.assertIsNone(self.node_mark())

    def test_gone_with_a_move_given_up_after_its_discards(self):
        self.zeroing_off_after_the_map()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertIsNone(self.node_mark())

    def test_a_failed_removal_only_logs(self):
        self.mock_object(self.b.marks, 'remove',
                         side_effect=OSError(13, 'Permission denied'))
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()
        self.assertIn('thin-mapped', str(self.log.warning.call_args_list))

    def stale_mark_of_another_move(self):
        """A move copied whole (no map), and an old mark of another."""
        self.b.pool.zeroing = False
        self.assertTrue(self.c.migrate(self.b))
        self.assertIsNone(self.node_mark())
        self.b.marks.write(self.c.volume_id, move.thin_map_tag('ab' * 16))

    def test_a_stale_mark_of_another_move_is_inert(self):
        self.stale_mark_of_another_move()
        self.b.restart()
        self.b.recover()
        self.b.monitor.tick()
        self.assertTrue(self.hydrating())
        self.c.settle()
        self.c.assert_completed()
        self.assertIsNone(self.node_mark())

    def test_a_rebuild_removes_a_stale_mark(self):
        self.stale_mark_of_another_move()
        self.b.reboot()
        self.b.recover()
        self.assertTrue(self.hydrating())
        self.assertIsNone(self.node_mark())

    def test_an_unreadable_mark_guards(self):
        # (Whose it is cannot be told: the guard costs only a pause.)
        self.b.pool.zeroing = False
        self.assertTrue(self.c.migrate(self.b))
        self.b.restart()
        self.b.recover()
        self.mock_object(self.b.marks, 'read',
                         side_effect=OSError(5, 'Input/output error'))
        self.b.monitor.tick()
        self.assertFalse(self.hydrating())
        self.mock_object(self.b.marks, 'read', return_value=None)
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()


class LateMarkTestCase(test.TestCase):
    """R14-2: the mark's check and write are two calls, without a lock.

    The destination of a move that its source then gives up passes the
    check (``preparing``, same move); its write is delayed (a database
    call that times out and is retried, a stalled greenthread).  The
    source gives up, a later move of the volume is recorded and mapped
    on its destination, which marks it.  The late write then replaces
    the later move's mark with the given-up move's tag: the later
    move's clone, whose regions were discarded, is no longer guarded.
    The same for ``forget_thin_map``: its delete is by key, after a
    check made by another call.  (Fixed: a key per move; each write or
    delete names only its own move's.)
    """

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.db = fakes.FakeDB()
        self.db.volumes[VOLUME_ID] = {'host': 'node-a@dmclone#dmclone'}
        self.store = move.Store(self.db)

    def load(self):
        return self.store.load(self.ctxt, VOLUME_ID)

    def later_move_marked_meanwhile(self):
        later = test_move.make_move()
        self.store.clear(self.ctxt, VOLUME_ID, self.first)
        self.store.save(self.ctxt, later)
        self.store.mark_thin_mapped(self.ctxt, later)
        self.assertTrue(self.load().thin_mapped)
        return later

    def test_a_late_mark_replaces_a_later_moves_mark(self):
        self.first = test_move.make_move()
        self.store.save(self.ctxt, self.first)
        update = self.db.volume_admin_metadata_update
        late = []

        def delayed(ctxt, volume_id, md, delete, *args, **kwargs):
            if any(is_mark(k) for k in md) and not late:
                late.append(None)
                late[0] = self.later_move_marked_meanwhile()
            return update(ctxt, volume_id, md, delete, *args, **kwargs)
        self.mock_object(self.db, 'volume_admin_metadata_update',
                         side_effect=delayed)
        self.store.mark_thin_mapped(self.ctxt, self.first)
        self.assertEqual(1, len(late))
        self.assertTrue(late[0].same_move(self.load()))
        self.assertTrue(self.load().thin_mapped,
                        'R14-2: the later move lost its mark to the late '
                        'write of a move given up')

    def test_a_late_forget_drops_a_later_moves_mark(self):
        self.first = test_move.make_move()
        self.store.save(self.ctxt, self.first)
        self.store.mark_thin_mapped(self.ctxt, self.first)
        delete = self.db.volume_admin_metadata_delete
        late = []

        def delayed(ctxt, volume_id, key):
            if is_mark(key) and not late:
                late.append(None)
                late[0] = self.later_move_marked_meanwhile()
            return delete(ctxt, volume_id, key)
        self.mock_object(self.db, 'volume_admin_metadata_delete',
                         side_effect=delayed)
        self.store.forget_thin_map(self.ctxt, self.first)
        self.assertEqual(1, len(late))
        self.assertTrue(self.load().thin_mapped,
                        'R14-2: the later move lost its mark to the late '
                        'forget of a move given up')


class LocalAttachWithoutCoordinationTestCase(test_driver.DriverTestBase):
    """R14-3: a local attach with no move now needs etcd.

    Before the races merge, a local attach (create_export and
    initialize_connection with this node's connector) of a volume that
    no move names took no lock: it worked while the coordination backend
    was down, as the operations guide's list of what fails then says.
    ``_ensure_handle(serving=...)`` now takes the volume's tooz lock in
    both, so every instance start or reboot on a node whose volumes are
    local fails during an etcd outage -- including Nova's
    ``resume_guests_state_on_host_boot`` after a power loss that took
    etcd down too -- with the raw tooz error.  The revert it guards
    against is node-local: a node-local lock would do.
    """

    LOCAL = {'host': 'node-a', 'initiator': 'iqn.1993-08.org:a'}

    def setUp(self):
        super().setUp()
        self._make_handle()
        self.mock_object(move, 'lock', side_effect=tooz_coordination.
                         ToozConnectionError('etcd: connection refused'))

    def test_local_create_export_without_etcd(self):
        self.assertEqual({}, self.drv.create_export(
            self.ctxt, self.volume, dict(self.LOCAL)))

    def test_local_initialize_connection_without_etcd(self):
        info = self.drv.initialize_connection(self.volume, dict(self.LOCAL))
        self.assertEqual('local', info['driver_volume_type'])


class StaleWholeRecordRegressesTheMoveTestCase(
        test_review11.ThinMapClusterTestCase):
    """R14-4 (before this change): the same stale save rewinds the move.

    The API's copy of the admin metadata read while the move was
    ``preparing``, saved whole by begin_attach after the source committed
    it: the state goes back to ``preparing`` (and the progress keys
    go).  What the nodes then do with a committed move recorded as
    ``preparing`` decides whether data is lost.
    """

    def rewound(self):
        stale = {}
        mark = self.b.store.mark_thin_mapped

        def api_reads(ctxt, t):
            stale.update(self.c.db.volume_admin_metadata_get(
                ctxt, t.volume_id))
            return mark(ctxt, t)
        self.mock_object(self.b.store, 'mark_thin_mapped',
                         side_effect=api_reads)
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, self.c.volume_id, dict(stale, attached_mode='rw'),
            True)
        self.assertEqual(move.PREPARING, self.c.transfer().state)

    def assert_kept(self):
        # The record names node-b (the source committed the move there):
        # node-b must still hold the volume's LV.  It was torn down and
        # wiped as a "stale prepare", every write made on node-b since the
        # commit with it, and the volume named a node without its LV.
        host = self.c.db.volumes[self.c.volume_id]['host']
        self.assertEqual(self.b.host, host)
        self.assertIn(fake_cluster.LV, self.b.vg.lvs,
                      'R14-4: node-b tore down and wiped the LV of a '
                      'volume its record names node-b')

    def test_the_monitor_keeps_a_committed_move_rewound_to_preparing(self):
        self.rewound()
        self.c.settle(ticks=40)
        self.assert_kept()

    def test_a_start_keeps_a_committed_move_rewound_to_preparing(self):
        # (It is rolled forward there: see test_rewound_move.)
        self.rewound()
        self.c.restart(self.b)
        self.assert_kept()

    # What else may meet a committed move rewound to ``preparing``.

    def test_a_delete_removes_every_copy(self):
        # The owner deletes the volume; Cinder routes it to node-b.
        self.rewound()
        self.c.delete()
        self.c.settle(ticks=8)
        self.c.assert_deleted()

    def test_a_delete_after_a_start_removes_every_copy(self):
        self.rewound()
        self.c.restart(self.b)
        self.c.delete()
        self.c.settle(ticks=8)
        self.c.assert_deleted()

    def test_a_migration_back_loses_nothing(self):
        # A retype with migration (or cinder migrate) back to node-a is
        # refused while the record says preparing: the volume stays
        # whole on node-b, its copy finished there.
        self.rewound()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.a)
        self.c.settle(ticks=40)
        self.assertEqual([], self.c.violations)
        self.assertIs(self.b, self.c.owner())
        self.assertTrue(self.b.vg.lvs[fake_cluster.LV]['complete'])

    # node-b rolls the move forward itself (a compare-and-set on the
    # same move: the record names node-b only after the source
    # committed): once finished, the volume moves again.
    def test_the_rewound_move_is_rolled_forward(self):
        self.rewound()
        self.c.settle(ticks=40)
        self.c.migrate(self.a)
        self.c.settle(ticks=40)
        self.assertEqual([], self.c.violations)
        self.assertIs(self.a, self.c.owner())
