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

"""The clone of a volume deleted while its destination was down.

Review 24 finding 2: node-b built move 1's clone and died; node-a gave
the move up (its abort never reached node-b) and the owner deleted the
volume.  At its start node-b finds only its own mark of the move, as its
destination: the clone goes, wiped, and the mark with it
(Recovery._drop_deleted).  Each control below leaves everything where a
check is needed: a live volume, move record or other mark naming the
LV; a database error; LVM unable to list the groups; a data LV without
its metadata LV.  A crash at each step of the teardown converges.
"""

import dataclasses

import ddt
from oslo_db import exception as db_exc

from cinder import objects
from cinder.tests.unit import fake_constants as fake

from cinder_dmclone import evidence
from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_lvm_unlisted
from tests.unit import test_review24
from tests.unit import test_two_nodes

OTHER_ID = fake.VOLUME2_ID


def given_up_then_deleted(test):
    """Move 1 given up while node-b was down, then the volume deleted.

    node-b keeps its clone (both LVs) and its mark; returns move 1.
    """
    scenario = test_review24.AbortNeverDeliveredTestCase
    scenario.given_up_while_b_is_down(test)
    t = test.c.transfer()
    scenario.destroy(test)
    test.assertEqual({LV, META}, set(test.b.vg.lvs))
    return t


@ddt.ddt
class DeletedCloneTestCase(test_two_nodes.ClusterTestCase):

    def setUp(self):
        super().setUp()
        #: move 1, as node-b's mark names it.
        self.t = given_up_then_deleted(self)
        self.assertEqual({}, self.a.vg.lvs)
        self.log.reset_mock()

    def start_b(self):
        """node-b's volume service starts again (its recovery runs)."""
        self.b.restart()
        self.b.recover()

    def mark(self):
        return self.b.part_marks.read(VOLUME_ID)

    def assert_dropped(self):
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)
        self.assertIsNone(self.mark())
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.b.wiped),
                        self.b.wiped)
        self.assertEqual({}, self.b.moves.recovery.pending_deleted)

    def assert_kept(self, lvs=(LV, META)):
        self.assertEqual([], self.c.violations)
        self.assertEqual(set(lvs), set(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)
        self.assertIsNotNone(self.mark())

    def add_volume(self, volume_id=OTHER_ID, **columns):
        """A live volume on node-a (not touching node-b)."""
        self.c.db.volumes[volume_id] = dict(
            {'host': self.a.host, 'size': 1, 'availability_zone': self.a.az,
             'provider_location': None, 'provider_auth': None}, **columns)

    def test_the_clone_goes_wiped_and_its_mark(self):
        self.start_b()
        self.assert_dropped()
        self.c.settle()
        self.assert_dropped()
        # Idempotent: a later start finds nothing to do.
        self.start_b()
        self.assert_dropped()
        self.log.exception.assert_not_called()

    def test_after_a_reboot(self):
        # (No clone table, no iSCSI session any more: only the LVs.)
        self.b.reboot()
        self.b.recover()
        self.assert_dropped()

    # A generic migration leaves a live volume whose _name_id is the id
    # of a deleted row: its LV is named after that id, like the mark's.
    # (Fails without the live volume check, recovery.volume_of_lv in
    # _named_elsewhere.)
    def test_a_live_volume_whose_lv_has_that_name_keeps_it(self):
        self.add_volume(_name_id=VOLUME_ID)
        self.assertEqual(LV, self.c.volume(OTHER_ID).name)
        self.start_b()
        self.c.now += 3600
        self.c.settle()
        self.assert_kept()

    # (Fails without the live record check of _named_elsewhere.)
    def test_a_live_move_record_naming_the_lv_keeps_it(self):
        self.add_volume()
        other = dataclasses.replace(
            self.t, volume_id=OTHER_ID, state=move.HYDRATING,
            dest_node='node-c', dest_host='node-c@dmclone#dmclone',
            secret='cd' * 16)
        self.c.db.admin_metadata[OTHER_ID] = other.to_metadata()
        self.start_b()
        self.c.settle()
        self.assert_kept()

    # (Fails without the other marks check of _named_elsewhere.)  The
    # other mark's volume lives; a mark of a deleted volume keeps
    # nothing (test_review27.TwoDeletedMarksTestCase).
    def test_another_mark_naming_the_lv_keeps_it(self):
        self.add_volume()
        self.b.destination.evidence.record(
            dataclasses.replace(self.t, volume_id=OTHER_ID,
                                secret='cd' * 16), evidence.DESTINATION)
        self.start_b()
        self.c.settle()
        self.assert_kept()
        self.assertIsNotNone(self.b.part_marks.read(OTHER_ID))

    def fail_once(self, cls, attr, picks):
        """``cls.attr`` fails once, as a database away, for ``picks``."""
        calls = getattr(cls, attr).side_effect
        fired = []

        def unreadable(ctxt, *args, **kwargs):
            if not fired and picks(*args, **kwargs):
                fired.append(True)
                raise db_exc.DBConnectionError('the database is away')
            return calls(ctxt, *args, **kwargs)
        self.mock_object(cls, attr, side_effect=unreadable)
        return fired

    # Only VolumeNotFound is a delete.  (Fails if any error of the
    # volume's read counts as one.)
    def test_a_database_error_leaves_everything(self):
        fired = self.fail_once(objects.Volume, 'get_by_id',
                               lambda volume_id: volume_id == VOLUME_ID)
        self.start_b()
        self.assertEqual([True], fired)
        self.c.settle()
        self.assert_kept()
        # The next start, with the database back, drops it.
        self.start_b()
        self.assert_dropped()

    # A database error while looking for a live volume named like the
    # LV: kept until the next start.
    def test_a_database_error_in_the_name_checks_leaves_everything(self):
        fired = self.fail_once(objects.VolumeList, 'get_all',
                               lambda filters: '_name_id' in filters)
        self.start_b()
        self.assertEqual([True], fired)
        self.c.settle()
        self.assert_kept()
        self.log.exception.assert_called()
        self.start_b()
        self.assert_dropped()

    # LVM cannot list the groups at start: kept, looked at again after
    # each monitor tick.  (Fails without AWAIT_LVM and retry_deleted:
    # taken as "no LVs here", the teardown refuses, and nothing looks
    # again.)
    def test_a_group_lvm_cannot_list_waits(self):
        with test_lvm_unlisted.unlisted(self.b):
            self.start_b()
            self.c.settle(ticks=2)
            self.assertEqual({VOLUME_ID},
                             set(self.b.moves.recovery.pending_deleted))
        self.assert_kept()
        self.c.settle(ticks=1)
        self.assert_dropped()

    # A data LV without its metadata LV is no part of a clone (an old
    # copy?): left, reported as an LV of a deleted volume.  (Fails
    # without KEEP_OLD_COPY in plan_deleted.)
    def test_a_data_lv_without_its_metadata_lv_is_left(self):
        self.b.dm.remove(fake_cluster.HANDLE)
        del self.b.vg.lvs[META]
        self.start_b()
        self.c.settle()
        self.assert_kept(lvs=(LV,))
        self.assertIn('no longer exists', str(self.log.warning.mock_calls))

    @ddt.data(
        # (object of node-b, attribute, when, the call's first argument)
        ('dest', 'tear_down', 'before', None),
        ('dm', 'remove', 'after', None),
        ('connector', 'disconnect_volume', 'after', None),
        ('vg', 'rename_volume', 'after', None),
        ('vg', 'delete', 'before', 'dmcwipe'),
        ('vg', 'delete', 'after', 'dmcwipe'),
        ('vg', 'delete', 'after', META),
        ('part_marks', 'remove', 'before', None),
    )
    @ddt.unpack
    def test_a_crash_at_each_step_converges(self, obj, attr, when, arg):
        crash = self.c.crash_at(
            getattr(self.b, obj), attr, when=when,
            match=lambda *a, **k: arg is None or (a and arg in str(a[0])))
        self.assertRaises(fake_cluster.Crash, self.start_b)
        self.assertTrue(crash['fired'])
        self.start_b()
        self.c.settle()
        self.assert_dropped()
