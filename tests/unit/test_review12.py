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

"""Review 12 of integ3 (the fixes of reviews 9 and 11): normal flows.

Each test names its finding (R12-n).  A test that fails shows the
defect; see the review's report for the sequence and the fix it asks.
The sequences follow Cinder 29's API and manager, where the harness
(tests/harness/fake_cluster.py) models them otherwise (said per test).
"""

from unittest import mock

from cinder import exception
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake

from cinder_dmclone import move
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_two_nodes

RESERVED = fields.VolumeAttachStatus.RESERVED
ATTACHED = fields.VolumeAttachStatus.ATTACHED


class Review12TestCase(test_two_nodes.ClusterTestCase):
    """Base: node-a holds the volume, node-b is where it may move."""

    def attachment_create_with_connector(self, node,
                                         instance_uuid=fake.INSTANCE_ID):
        """Cinder 29's ``attachment_create`` with a connector.

        What Nova's pre_live_migration calls on the destination
        (``volume_api.attachment_create(..., connector=connector)``).
        volume/api.py reserves the attachment (``_attachment_reserve``:
        an in-use volume is reserved again for the same instance), then
        calls the manager's attachment_update.  If that raises, the API
        returns an error and the attachment stays ``reserved``, with no
        connector and no host: api/v3/attachments.py removes nothing,
        and Nova never learnt its id, so it cannot delete it either.
        (Cluster.attach removes it: the attachment_update flow, where
        Nova knows the id and deletes it.)
        """
        att = {'id': next(self.c._ids), 'instance_uuid': instance_uuid,
               'attach_status': RESERVED, 'attached_host': None,
               'connector': None}
        self.c.attachments.append(att)
        owner = self.c.owner()
        info = self.c.call(owner, owner.attach, self.c.volume(),
                           dict(node.props))
        att.update(attach_status=ATTACHED, attached_host=node.name,
                   connector=dict(node.props))
        return att, info

    def failed_attachment_create(self, node):
        """A live migration's attachment_create that the source refused.

        (Here: the volume had a snapshot, Source._refuse_snapshots's
        InvalidVolume; any refusal of the move does the same: the
        destination's thin pool full, MoveInProgress, VolumeNotMovable.)
        Returns the reserved attachment it leaves behind.
        """
        self.c.snapshots.append(mock.sentinel.snapshot)
        before = list(self.c.attachments)
        exc = self.assertRaises(exception.CinderException,
                                self.attachment_create_with_connector, node)
        self.assertIn('snapshot', str(exc))
        self.c.snapshots.clear()
        left = [a for a in self.c.attachments if a not in before]
        self.assertEqual(1, len(left))
        return left[0]

    # R12-1 (HIGH, regression): Source._refuse_unless_movable (R11-2)
    # lets a migration move only a volume whose status is 'available'.
    # Cinder 29's migrate API sets the status of an available volume to
    # 'maintenance' when the admin asks --lock-volume True (api.py
    # migrate_volume: "no action is allowed on this volume", the safe
    # way to drain a node), and the manager restores it only after the
    # driver returned (manager.migrate_volume: status_update).  Every
    # such drain now fails with VolumeNotMovable ("its status is
    # maintenance"), migration_status error; d026a18 moved it.
    # (manager_flow.migrate_volume does not model the status at all.)
    def test_r12_1_migrate_with_lock_volume_moves(self):
        self.c.db.volumes[VOLUME_ID]['status'] = 'maintenance'
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()

    # R12-1b (MEDIUM, regression): a retype whose types differ only in
    # volume_backend_name / availability zone (manager._can_use_driver_
    # migration) calls the driver's migrate_volume with the volume
    # 'retyping' (api.retype sets it; manager.migrate_volume restores
    # previous_status after the driver).  Refused as well now.
    def test_r12_1b_retype_with_driver_migration_moves(self):
        self.c.db.volumes[VOLUME_ID]['status'] = 'retyping'
        self.assertTrue(self.c.migrate(self.b))

    # R12-2 (HIGH, regression): an unconnected attachment (R11-1:
    # instance, reserved, no host) is counted as "may use the source"
    # for ever.  Cinder leaves exactly such an attachment behind every
    # time an attachment_create with a connector fails (see
    # attachment_create_with_connector): a live migration whose first
    # attempt the source refused.  The retried live migration moves the
    # volume in 'cloned' (hydration off: the source is attached, right),
    # but at Nova's post-migration detach of the source, Destination.
    # detached sees may_use == 2 and does not commit, and every monitor
    # tick's commit_pending sees the orphan (may_use == 1) and returns
    # False, silently.  The volume never hydrates: every read of an
    # unwritten region goes to node-a over iSCSI for ever, node-a cannot
    # be drained, and node-a's reboot fails the instance's I/O on
    # node-b.  Nothing tells the user or the operator; only an
    # ``attachment-delete`` of an attachment nobody knows about clears
    # it.  d026a18 committed at the detach.
    def test_r12_2_orphan_of_a_failed_live_migration_blocks_the_commit(self):
        src = self.c.attach(self.a)[0]
        orphan = self.failed_attachment_create(self.b)
        self.assertEqual((RESERVED, None),
                         (orphan['attach_status'], orphan['attached_host']))
        self.attachment_create_with_connector(self.b)     # the retry
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.detach(src)          # Nova's _post_live_migration
        self.c.settle()
        self.assertNotEqual(
            move.CLONED, getattr(self.c.transfer(), 'state', None),
            'the move waits in cloned for ever behind a reserved '
            'attachment that Cinder left from a failed attachment_create')

    # R12-2b (HIGH, regression): the same orphan on an available volume
    # (an attachment_create with a connector refused: status stays
    # 'reserved', and Cinder reserves it again for the same instance).
    # The next attach elsewhere moves it with hydration off
    # (_may_be_used_here: two unconnected, minus one) and the move
    # never commits: it never hydrates although nothing uses node-a.
    def test_r12_2b_orphan_keeps_a_later_attach_move_from_hydrating(self):
        self.failed_attachment_create(self.b)
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    # R12-3 (LOW): driver.migrate_volume calls create_export, which
    # (R9-L2) records an iSCSI attach in flight; no initialize_connection
    # follows (the migration's move is Source.move itself), so
    # attach_done never runs: the entry stays in attaches_in_flight for
    # ever (pruned by nobody; only its age stops it counting, after
    # stale_prepare_after), and the next real attach's attach_done pops
    # this stale entry (FIFO), leaving its own.  Meanwhile
    # _drop_emptied_export keeps an export that admits nobody, logging
    # that an attach is connecting.  The same when Cinder's
    # _connection_create fails between create_export and
    # initialize_connection (its volume.save(): ExportFailure).
    def test_r12_3_migration_leaves_no_attach_in_flight(self):
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual({}, self.a.source.attaches_in_flight)
