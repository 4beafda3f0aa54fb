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

"""Races that earlier reviews named: two operations on one volume.

Each test stages a second operation at a precise moment of the first,
in one thread: an operation that would wait for the volume's lock held
by the first is run once the first released it; one that takes no lock
runs right there.  What is expected comes from what a user needs: no
data lost, no tenant reading another's data, no volume left stuck.
"""

import contextlib
import functools

import ddt

from cinder import exception

from cinder_dmclone import move
from tests.harness.fake_cluster import HANDLE_PATH
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_driver
from tests.unit.test_driver import HANDLE
from tests.unit.test_driver import LV
from tests.unit import test_two_nodes

IQN = test_two_nodes.IQN


@contextlib.contextmanager
def another_thread(cluster):
    """Run the block as a thread other than the one holding the locks.

    The fake coordination backend (fake_cluster.FakeLock) takes a lock
    held by the test's one thread for a deadlock; held by another
    thread it is busy: a non-blocking take fails, as the monitor's does.
    """
    held = set(cluster.held)
    cluster.held.difference_update(held)
    cluster.busy.update(held)
    try:
        yield
    finally:
        cluster.busy.difference_update(held)
        cluster.held.update(held)


class TickDuringABackupsExportTestCase(test_two_nodes.ClusterTestCase):
    """R9-L2: a monitor tick between the steps of a backup's attach.

    A move from node-a that never committed left node-a's export
    admitting node-b, and the record of that ACL (a failed attempt that
    could not give its move up): each monitor tick removes that ACL,
    and the target with it once it admits nobody.  cinder-backup on
    node-c attaches the volume meanwhile, with Cinder's
    initialize_connection: create_export (which finds the target and
    reuses it), then initialize_connection (node-c's ACL).  A tick in
    between must not remove the target create_export handed out: the
    backup would read from a target that is gone.
    """

    NODE_C = {'host': 'node-c', 'ip': '10.0.0.3',
              'initiator': 'iqn.1993-08.org.debian:01:node-c'}

    def setUp(self):
        super().setUp()
        ctxt = self.c.ctxt
        update = self.a.target.create_export(ctxt, self.volume(),
                                             HANDLE_PATH)
        self.c.db.volume_update(ctxt, VOLUME_ID,
                                {'provider_location': update['location'],
                                 'provider_auth': update['auth']})
        self.a.target.initialize_connection(self.volume(), self.b.props)
        self.c.db.volume_admin_metadata_update(
            ctxt, VOLUME_ID, {test_two_nodes.move.EXPORT_KEY: 'node-a %s'
                              % self.b.props['initiator']}, False)
        self.a.source.leftover_exports.add(VOLUME_ID)

    def acl(self):
        return set(self.a.target.exports.get(IQN, {}).get('acl', ()))

    def tick_inside(self, obj, attr, when):
        """A monitor tick of node-a's, from another thread, at ``attr``."""
        original = getattr(obj, attr)
        ticks = []

        def racing(*args, **kwargs):
            if when == 'after':
                result = original(*args, **kwargs)
            with another_thread(self.c):
                self.c.tick(self.a)
            ticks.append({k: list(v) for k, v in
                          self.a.source.attaches_in_flight.items()})
            if when == 'before':
                result = original(*args, **kwargs)
            return result
        self.mock_object(obj, attr, side_effect=racing)
        return ticks

    def backup_attach(self):
        """cinder-backup's attach on node-c: Cinder's two driver calls."""
        connector = dict(self.NODE_C)
        self.a.create_export(self.c.ctxt, self.volume(), connector)
        return self.a.initialize_connection(self.volume(), connector)

    def assert_backup_connected(self, info):
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertIn(IQN, self.a.target.exports)
        self.assertEqual({self.NODE_C['initiator']}, self.acl())
        self.assertEqual({}, self.a.source.attaches_in_flight)
        # Later ticks leave the backup's export alone ...
        self.c.settle()
        self.assertEqual({self.NODE_C['initiator']}, self.acl())
        # ... and forgot the move's ACL: it is gone.
        self.assertNotIn(test_two_nodes.move.EXPORT_KEY,
                         self.c.transfer_keys())
        self.assertEqual([], self.c.violations)

    def test_tick_while_create_export_makes_the_target(self):
        # The tick comes while create_export holds the volume's lock,
        # right after the target was made: it cannot take the lock and
        # leaves the export for a later tick.
        ticks = self.tick_inside(self.a.target, 'create_export', 'after')
        info = self.backup_attach()
        self.assertEqual(1, len(ticks))
        self.assertEqual({}, ticks[0])      # (the marker not made yet)
        self.assert_backup_connected(info)

    def test_tick_between_create_export_and_initialize_connection(self):
        # The tick comes once create_export returned: it removes the
        # move's ACL, but the target admits nobody only because node-c's
        # ACL is still to come: the attach in flight keeps it.
        ticks = self.tick_inside(self.a, 'initialize_connection', 'before')
        info = self.backup_attach()
        self.assertEqual(1, len(ticks))
        self.assertEqual([self.NODE_C['initiator']],
                         [who for who, _ in ticks[0][VOLUME_ID]])
        self.assertIn(IQN, self.a.target.exports)
        self.assert_backup_connected(info)


class StaleDeleteDuringARollbackTestCase(test_two_nodes.ClusterTestCase):
    """R9-L1: a delete routed to the old destination by a stale read.

    cinder-api read the volume while its record named node-b (the move's
    destination); the delete reaches node-b while a rollback there holds
    the volume's lock, or right after it released it.  Then the volume
    lives on node-a again: its LV there is the only copy, and an LV kept
    on node-b (a clone that lost its metadata) may hold the instance's
    last writes.  Neither may go; the delete is refused (Cinder keeps
    the record, error_deleting) and a new one goes to node-a.
    (test_two_nodes.StaleHostAfterKeptRollbackTestCase has the kept
    rollback's delete after and during it.)
    """

    roll_back_keeping_lv = (
        test_two_nodes.StaleHostAfterKeptRollbackTestCase.roll_back_keeping_lv)
    assert_delete_refused_and_nothing_gone = (
        test_two_nodes.StaleHostAfterKeptRollbackTestCase
        .assert_delete_refused_and_nothing_gone)

    def delete_waiting_for(self, rollback):
        """The delete's first read made, it waits for the rollback's lock.

        ``rollback()`` runs when the delete asks for the lock; returns
        whether it ran.
        """
        locking = test_two_nodes.move.lock
        raced = []

        def lock(volume_id):
            if not raced:
                raced.append(volume_id)
                rollback()
            return locking(volume_id)
        self.mock_object(test_two_nodes.move, 'lock', side_effect=lock)
        return raced

    def assert_volume_on_a(self):
        self.assertEqual(self.a.host,
                         self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIn(test_two_nodes.LV, self.a.vg.lvs)
        self.assertTrue(self.a.vg.lvs[test_two_nodes.LV]['complete'])
        self.assertIn(test_two_nodes.HANDLE, self.a.dm.devices)
        self.assertEqual([], self.a.wiped)

    def test_delete_right_after_a_plain_rollback_is_refused(self):
        src, dst = self.moved(live=True)
        stale = self.volume()               # cinder-api's read: node-b
        self.c.detach(dst)                  # Nova's rollback detach
        self.c.assert_no_transfer()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.b.delete_volume, stale)
        self.assert_volume_on_a()
        self.assertEqual([], self.c.violations)

    def test_delete_waiting_for_a_plain_rollbacks_lock_is_refused(self):
        src, dst = self.moved(live=True)
        stale = self.volume()
        raced = self.delete_waiting_for(lambda: self.c.detach(dst))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.b.delete_volume, stale)
        self.assertEqual(1, len(raced))
        self.assert_volume_on_a()
        self.assertEqual([], self.c.violations)

    def test_delete_after_a_kept_rollback_cut_short_keeps_both_copies(self):
        # The rollback pointed the record at node-a, then its clear
        # failed: the move is still recorded 'cloned' when the stale
        # delete comes.  Neither node-a's LV (the volume) nor node-b's
        # kept one may go; Nova's retried detach then ends the move.
        src, dst, stale = self.roll_back_keeping_lv()
        clear = self.b.store.clear
        failed = []

        def clear_once_failing(*args, **kwargs):
            if not failed:
                failed.append(True)
                raise test_two_nodes.db_exc.DBConnectionError()
            return clear(*args, **kwargs)
        self.mock_object(self.b.store, 'clear',
                         side_effect=clear_once_failing)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.detach, dst)
        self.assertEqual(test_two_nodes.move.CLONED,
                         self.c.transfer().state)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.b.delete_volume, stale)
        self.assert_volume_on_a()
        self.assertIn(test_two_nodes.LV, self.b.vg.lvs)
        self.assertEqual([], self.b.wiped)
        self.c.detach(dst)                  # Nova retries it: node-a
        self.c.assert_no_transfer()
        self.assert_volume_on_a()
        self.assertIn(test_two_nodes.LV, self.b.vg.lvs)
        self.assertEqual([], self.b.wiped)
        self.assertEqual([], self.c.violations)

    def test_delete_waiting_for_the_rollback_after_its_record_moved(self):
        # The delete's first read comes inside the rollback, after the
        # record named node-a again and before the move was cleared:
        # it sees the move, waits for the lock, and reads again.
        src, dst, stale = self.roll_back_keeping_lv()
        clear = self.b.store.clear
        seen = []

        def clear_after_the_deletes_read(ctxt, volume_id, t):
            seen.append(self.b.destination.load(volume_id))
            return clear(ctxt, volume_id, t)
        self.mock_object(self.b.store, 'clear',
                         side_effect=clear_after_the_deletes_read)
        load = self.b.destination.load
        reads = []

        def first_read_from_inside(volume_id):
            if not reads:
                reads.append(volume_id)
                self.c.detach(dst)
                return seen[0]
            return load(volume_id)
        self.mock_object(self.b.destination, 'load',
                         side_effect=first_read_from_inside)
        self.assert_delete_refused_and_nothing_gone(stale)
        self.assertTrue(self.b.destination.is_dest(seen[0]))


class MigrateRacingAnAttachTestCase(test_two_nodes.ClusterTestCase):
    """``cinder migrate`` to node-b racing an attach from another node.

    Cinder reserves an attachment of an available volume whatever its
    ``migration_status``, so an instance's attach may come while the
    driver migrates.  Whatever the order, the user needs: the volume
    lives on one node, whole, with no move left stuck; an attach that
    succeeded reaches that copy (never one about to be retired); one
    that failed can be retried.
    """

    NODE_C = TickDuringABackupsExportTestCase.NODE_C

    def reserve(self):
        """Cinder's _attachment_reserve of an instance's attachment."""
        att = {'id': next(self.c._ids), 'instance_uuid':
               test_two_nodes.INSTANCE2_ID,
               'attach_status': test_two_nodes.RESERVED,
               'attached_host': None, 'connector': None}
        self.c.attachments.append(att)
        return att

    def export(self, connector):
        """The manager's first half of an attach: create_export, saved."""
        owner = self.c.owner()
        owner._save(self.volume(), owner.create_export(
            self.c.ctxt, self.volume(), dict(connector)))

    def connect(self, att, connector):
        """The second half, on the node the record names now.

        Its failure removes the export, as the manager does; the
        attachment then stays reserved (the API's caller retries).
        Returns the connection info, or the error.
        """
        owner = self.c.owner()
        volume = self.volume()
        try:
            info = owner.initialize_connection(volume, dict(connector))
        except Exception as exc:
            owner.remove_export(self.c.ctxt, volume)
            return exc
        att.update(attach_status=test_two_nodes.ATTACHED,
                   attached_host=connector['host'],
                   connector=dict(connector))
        return info

    def attach_during(self, obj, attr, connector):
        """An attach whose calls all come while ``obj.attr`` runs."""
        original = getattr(obj, attr)
        outcome = []

        def racing(*args, **kwargs):
            result = original(*args, **kwargs)
            if outcome:
                return result
            att = self.reserve()
            try:
                self.export(connector)
            except Exception as exc:
                outcome.append(exc)
            else:
                outcome.append(self.connect(att, connector))
            return result
        self.mock_object(obj, attr, side_effect=racing)
        return outcome

    def assert_one_whole_copy(self):
        """The volume lives on one node, whole; no move left recorded."""
        self.c.settle()
        self.c.assert_no_transfer()
        self.assertEqual([], self.c.violations)
        owner = self.c.owner()
        other = self.a if owner is self.b else self.b
        self.assertTrue(owner.vg.lvs[test_two_nodes.LV]['complete'])
        self.assertNotIn(test_two_nodes.LV, other.vg.lvs)

    def assert_reaches_the_volume(self, info, connector):
        """An attach that succeeded reads the copy the record names."""
        owner = self.c.owner()
        if info['driver_volume_type'] == 'local':
            self.assertEqual(connector['host'], owner.name)
        else:
            props = info['data']
            self.assertEqual('%s:3260' % owner.target.ip,
                             props['target_portal'])
            self.assertIn(connector['initiator'],
                          owner.target.exports[props['target_iqn']]['acl'])

    def test_attach_on_node_b_during_the_migrations_build(self):
        outcome = self.attach_during(self.b.dest, 'build_clone',
                                     self.b.props)
        moved = self.c.migrate(self.b)
        self.assertEqual(1, len(outcome))
        self.assertTrue(moved)
        self.assertIsInstance(outcome[0], Exception)
        self.assert_one_whole_copy()
        self.assertIs(self.b, self.c.owner())

    def test_backup_attach_on_node_c_during_the_migrations_build(self):
        outcome = self.attach_during(self.b.dest, 'build_clone',
                                     self.NODE_C)
        self.assertTrue(self.c.migrate(self.b))
        self.assertIsInstance(outcome[0], Exception)
        self.assert_one_whole_copy()

    def test_attach_on_node_b_as_the_migration_returns(self):
        # The migration's move has named node-b in the record and let
        # the volume's lock go: the attach, routed there, is a local
        # attach on the destination.
        outcome = self.attach_during(self.a.source, 'attach_done',
                                     self.b.props)
        self.assertTrue(self.c.migrate(self.b))
        self.assertNotIsInstance(outcome[0], Exception)
        self.assert_reaches_the_volume(outcome[0], self.b.props)
        self.assert_one_whole_copy()

    def attach_straddling_the_migration(self, connector):
        """create_export before the migration's move, the connection after.

        (The attach's initialize_connection waited for the volume's lock
        the migration held.)  Returns (migrated or the error, outcome).
        """
        move = self.a.source.move
        att = []

        def export_first(*args, **kwargs):
            att.append(self.reserve())
            self.export(connector)
            return move(*args, **kwargs)
        self.mock_object(self.a.source, 'move', side_effect=export_first)
        try:
            moved = self.c.migrate(self.b)
        except Exception as exc:
            moved = exc
        return moved, self.connect(att[0], connector)

    def test_attach_on_node_b_straddling_the_migration(self):
        # The migration sees the attachment and is refused; the attach
        # then moves the volume.
        moved, info = self.attach_straddling_the_migration(self.b.props)
        self.assertIsInstance(moved, exception.VolumeBackendAPIException)
        self.assertNotIsInstance(info, Exception)
        self.assertIs(self.b, self.c.owner())
        self.assert_reaches_the_volume(info, self.b.props)
        self.assert_one_whole_copy()

    def test_backup_attach_on_node_c_straddling_the_migration(self):
        # The migration is refused; node-c reads node-a's copy, which
        # stays.
        moved, info = self.attach_straddling_the_migration(self.NODE_C)
        self.assertIsInstance(moved, exception.VolumeBackendAPIException)
        self.assertNotIsInstance(info, Exception)
        self.assertIs(self.a, self.c.owner())
        self.assert_reaches_the_volume(info, self.NODE_C)
        self.assert_one_whole_copy()


class Waits(BaseException):
    """Another thread asked for a lock held: it waits (see VolumeLocks).

    Not an Exception: no handler of the code under test catches it, as
    none runs in a thread that is only waiting.
    """


class VolumeLocks(object):
    """move.lock of one driver's thread, and of one racing with it.

    The racing thread's ask for a lock the first holds raises Waits:
    the test runs the racing operation again once the lock is free.
    """

    def __init__(self):
        self.held = set()

    @contextlib.contextmanager
    def lock(self, volume_id):
        if volume_id in self.held:
            raise Waits(volume_id)
        self.held.add(volume_id)
        try:
            yield
        finally:
            self.held.discard(volume_id)


@ddt.ddt
class ThinRevertRacingAnOpenTestCase(test_driver.DriverTestBase):
    """A thin revert racing what opens the volume's LV on this node.

    The revert removes the handle, checks that nothing holds the LV or
    the snapshot's open (R13-1), then merges (lvconvert --merge).  A
    request that maps the handle in between -- a local attach's
    create_export or initialize_connection, an iSCSI attach's or a
    move's create_export, whose LIO backstore is the handle -- holds
    the LV open: LVM then defers the merge to the LV's next activation,
    a reboot's, which swaps the snapshot in under every write made
    since.  Such a request must wait for the revert (or the revert see
    it and refuse): the merge never runs with the LV open.
    """

    LOCAL = {'host': 'node-a', 'initiator': 'iqn.1993-08.org:a'}
    REMOTE = {'host': 'node-c', 'initiator': 'iqn.1993-08.org:c'}

    def setUp(self):
        super().setUp()
        self.drv.configuration.lvm_type = 'thin'
        self._make_handle()
        self.snap = self._snapshot()
        self.lvs['_' + self.snap.name] = '1.00'
        # The handle, while it exists, holds the volume's LV open.
        self.vg.lv_is_open.side_effect = lambda name: (
            name == LV and HANDLE in self.dm.devices)
        self.locks = VolumeLocks()
        self.mock_object(move, 'lock', side_effect=self.locks.lock)
        # (a racing request in this same thread would block for ever on
        # the real process-local lock: it raises Waits instead)
        self.handle_locks = VolumeLocks()
        self.mock_object(move, 'handle_lock',
                         side_effect=self.handle_locks.lock)
        self.mock_object(self.drv.target_driver, 'create_export',
                         return_value={'location': '10.0.0.1:3260,1 %s 0'
                                       % test_driver.HANDLE_PATH,
                                       'auth': None})
        self.merges = []
        self.waited = []

    def opening(self, request):
        """``request()`` runs right before the merge, from another thread.

        Returns what it returned, once it ran (at once, or once the
        revert let the volume's lock go).
        """
        done = []

        def race_then_merge(name):
            try:
                done.append(request())
            except Waits:
                self.waited.append(name)
            self.merges.append(self.vg.lv_is_open(LV))
        self.vg.revert.side_effect = race_then_merge
        return done

    def revert_then(self, request, done):
        try:
            self.drv.revert_to_snapshot(self.ctxt, self.volume, self.snap)
        except exception.VolumeBackendAPIException:
            pass        # (refusing the revert, nothing changed, is right)
        if self.waited:
            done.append(request())
        return done

    @ddt.data(
        ('initialize_connection', lambda self: self.drv.initialize_connection(
            self.volume, dict(self.LOCAL))),
        ('create_export local', lambda self: self.drv.create_export(
            self.ctxt, self.volume, dict(self.LOCAL))),
        ('create_export remote', lambda self: self.drv.create_export(
            self.ctxt, self.volume, dict(self.REMOTE))))
    @ddt.unpack
    def test_no_merge_while_a_request_maps_the_handle(self, _name, call):
        request = functools.partial(call, self)
        done = self.revert_then(request, self.opening(request))
        self.assertEqual([False] * len(self.merges), self.merges,
                         'lvconvert --merge ran with the LV held open by '
                         'a handle mapped meanwhile: LVM defers the '
                         'merge to the next activation')
        # The request is served, after the revert if it waited.
        self.assertEqual(1, len(done))
        self.assertIn(HANDLE, self.dm.devices)
