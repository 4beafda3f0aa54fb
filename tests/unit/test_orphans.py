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

"""Orphaned and tenant-made reserved attachments at the worst moment.

What such an attachment looks like in Cinder 29 (volume/api.py,
volume/manager.py):

- ``_attachment_reserve`` (every ``attachment_create``) writes it
  ``reserved``, with the instance given (or none), no host and no
  connector, and turns an ``available`` volume ``reserved``.  Another
  reserve of a ``reserved`` or ``in-use`` volume that is not multiattach
  is refused unless the volume already has an attachment of the same
  instance: the override that live migrations use, and that lets the
  owner make any number of them for that instance.
- With a connector, the API then calls the manager's attachment_update:
  ``_connection_create`` runs the driver's create_export and
  initialize_connection, and only after the driver returned writes the
  attachment ``attaching`` with its connector; then ``attached`` with
  its host.  If the driver raises, nothing deletes the attachment (its
  caller never learnt its id): an orphan, ``reserved`` for ever.
- Without a connector (``cinder attachment-create`` with none; Nova for
  a shelved-offloaded instance) nothing else happens: it stays as
  reserved, and the owner deletes it when it likes (the API deletes a
  ``reserved`` attachment without asking any volume service).
- Cinder's own ``os-initialize_connection`` (the legacy attach) asks the
  driver for a connection with any connector and records no attachment.

The driver is never told which attachment a connection is for.  Each
test states what a user needs whatever the orphans: no volume moved for
an attach that no longer exists, no migration undone or held for ever
by one, no copy retired under an instance that uses it.
"""

from cinder import exception
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake

from cinder_dmclone import move
from tests.harness.fake_cluster import VOLUME_ID
from tests.harness import manager_flow
from tests.unit import test_two_nodes

RESERVED = fields.VolumeAttachStatus.RESERVED
ATTACHING = fields.VolumeAttachStatus.ATTACHING
ATTACHED = fields.VolumeAttachStatus.ATTACHED
INSTANCE2_ID = test_two_nodes.INSTANCE2_ID


class OrphansTestCase(test_two_nodes.ClusterTestCase):
    """Base: node-a holds the volume, node-b is where it may move."""

    def reserve(self, instance_uuid=fake.INSTANCE_ID):
        """The owner's ``cinder attachment-create`` with no connector.

        Cinder 29's ``_attachment_reserve``: reserved, no host, no
        connector; an available volume turns ``reserved``.
        """
        att = {'id': next(self.c._ids), 'instance_uuid': instance_uuid,
               'attach_status': RESERVED, 'attached_host': None,
               'connector': None}
        self.c.attachments.append(att)
        rec = self.c.db.volumes[VOLUME_ID]
        if rec.get('status', 'available') == 'available':
            rec['status'] = 'reserved'
        return att

    def during(self, obj, attr, action):
        """Run ``action()`` at the first call of ``obj.attr``, then it."""
        original = getattr(obj, attr)
        actions = [action]

        def first_action(*args, **kwargs):
            while actions:
                actions.pop()()
            return original(*args, **kwargs)
        self.mock_object(obj, attr, side_effect=first_action)

    def during_build(self, action):
        """Run ``action()`` once, after node-b's first clone build."""
        build = self.b.dest.build_clone
        actions = [action]

        def build_then_act(*args, **kwargs):
            path = build(*args, **kwargs)
            while actions:
                actions.pop()()
            return path
        self.mock_object(self.b.dest, 'build_clone',
                         side_effect=build_then_act)

    def withdraw_newest(self):
        """Nova deletes the attachment of the attach in progress (newest).

        Its attach call timed out; it knows that attachment's id
        (attachment_create without a connector in nova-api, then
        attachment_update from nova-compute) and deletes it.
        """
        att = self.c.attachments[-1]
        self.assertEqual(RESERVED, att['attach_status'])
        self.c.attachments.remove(att)

    def assert_stays_on_a(self):
        self.assertEqual([], self.c.violations)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIsNone(self.a.source.load(VOLUME_ID))
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)


class WithdrawnAttachTestCase(OrphansTestCase):
    """Source._refuse_if_attach_withdrawn beside orphans (open point a)."""

    def test_withdrawn_attach_beside_an_orphan_is_given_up(self):
        # The owner left an orphan for instance I (or a failed attach
        # did).  Nova attaches the volume to I on node-b (the override
        # lets it reserve), its call times out while node-b builds, and
        # it deletes its own attachment.  The orphan, still reserved,
        # must not pass for that attach: no instance will use node-b's
        # clone.
        orphan = self.reserve()
        self.during_build(self.withdraw_newest)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('was deleted while the move was prepared', str(exc))
        self.assert_stays_on_a()
        self.assertEqual([orphan['id']],
                         [a['id'] for a in self.c.attachments])

    def test_attach_withdrawn_while_it_waits_for_the_lock(self):
        # The same, but Nova gave up while the attach waited for the
        # volume's lock (another step held it): its attachment is gone
        # before the move is even recorded, and only the orphan is
        # starting when the move reads the attachments.
        self.reserve()
        self.during(self.a.source, '_refuse_snapshots', self.withdraw_newest)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assert_stays_on_a()

    def test_attach_withdrawn_while_it_waits_for_the_lock_alone(self):
        # No orphan at all: nothing is starting once the move reads.
        self.during(self.a.source, '_refuse_snapshots', self.withdraw_newest)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assert_stays_on_a()

    def test_attach_withdrawn_before_its_move_read_it_is_refused(self):
        # Nova gave up between the attach's first look (wants_move saw
        # its attachment starting) and the move's own read: the move
        # reads no attachment starting at all.  An empty set is an
        # attach withdrawn, never one that may go on (before 590bd61 it
        # let the move through).
        self.during(self.a.source, '_attaches_starting',
                    self.withdraw_newest)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('was deleted before the move began', str(exc))
        self.assert_stays_on_a()

    def test_orphan_deleted_during_an_attach_blocks_no_attach_for_ever(self):
        # The owner deletes its orphan while an attach on node-b builds.
        # Which of the two went cannot be told (the driver is never told
        # its attachment's id): that attempt may be given up, never a
        # retry once the orphan is gone.
        orphan = self.reserve()
        self.during_build(lambda: self.c.attachments.remove(orphan))
        try:
            self.c.attach(self.b)
        except exception.VolumeBackendAPIException:
            self.assert_stays_on_a()
            # (Its attachment stays reserved, as Cinder leaves it.)
            self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_a_migration_stands_when_a_reserved_attachment_comes_and_goes(
            self):
        # The owner reserves an attachment (attachment-create with no
        # connector) once the migration checked for attachments, and
        # deletes it while node-b builds.  No attach asked for the
        # migration: it is no withdrawn attach, and the drain goes on.
        att = {}

        def reserve():
            att.update(self.reserve(INSTANCE2_ID))
        self.during(self.a.source, '_record', reserve)
        self.during_build(lambda: self.c.attachments.remove(
            [a for a in self.c.attachments if a['id'] == att['id']][0]))
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()


class LocalAttachRacingAMigrationTestCase(OrphansTestCase):
    """A local attach racing a migration's start (open point b)."""

    def test_no_copy_handed_out_is_retired_before_its_attach_is_recorded(
            self):
        # A local attach on node-a reserves its attachment after the
        # migration's check for attachments, and node-a's driver answers
        # it before the move is recorded.  Cinder writes the attachment
        # 'attaching' (with its host) only after the driver returned;
        # node-b's monitor ticks meanwhile (the manager's write is slow:
        # its database retries).  Nova then gets the path and writes to
        # node-a's copy: the move must not have committed (it would
        # hydrate from that copy and retire it).  Refusing the local
        # attach is fine too: then nothing uses node-a's copy, and the
        # attachment it leaves reserved must not hold the migration.
        att = {}
        got = {}

        def local_attach():
            att.update(self.reserve(INSTANCE2_ID))
            try:
                got['info'] = manager_flow.initialize_connection(
                    self.a, self.c.ctxt, self.volume(), dict(self.a.props),
                    self.a._save)
            except Exception as exc:
                got['refused'] = exc
        self.during(self.a.source, '_record', local_attach)
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        local = [a for a in self.c.attachments if a['id'] == att['id']][0]
        if 'refused' in got:
            self.assertIn('moving', str(got['refused']))
            self.c.assert_completed()
            return
        self.assertEqual('local', got['info']['driver_volume_type'])
        local.update(attach_status=ATTACHING, connector=dict(self.a.props))
        local.update(attach_status=ATTACHED, attached_host='node-a')
        self.c.settle()
        self.assertEqual(
            move.CLONED, getattr(self.c.transfer(), 'state', None),
            'the move committed while node-a had just handed its copy out '
            'to a local attach: it hydrates from it and retires it')


class ConnectionBesideAnOrphanTestCase(OrphansTestCase):
    """Which attach is an instance's (open point a): a known limitation.

    Source.wants_move takes an attach from another node for an
    instance's when an instance attachment of the volume is being set up
    (reserved or attaching): Cinder reserves an attach's own attachment
    before it asks for the connection, and never tells the driver which
    attachment a connection is for.  Cinder's own attaches without an
    instance (cinder-backup, a generic migration's copy) cannot meet an
    orphan: they need the volume ``available`` (an orphan makes it
    ``reserved``) or, in use, copy a temporary volume.  What remains is
    the owner's (or an admin's) ``os-initialize_connection`` with a
    connector naming another node of the backend while an orphan is
    reserved: it is taken for an instance's attach.  These tests pin
    what it does and the cure (doc/source/limitations.rst).
    """

    def legacy_connection(self, node):
        """Cinder's os-initialize_connection from ``node``: no attachment."""
        owner = self.c.owner()
        return self.c.call(owner, owner.attach, self.volume(),
                           dict(node.props))

    def legacy_termination(self, node):
        """Cinder's os-terminate_connection from ``node``."""
        owner = self.c.owner()
        return self.c.call(owner, owner.terminate_connection, self.volume(),
                           dict(node.props))

    def test_without_an_orphan_it_is_an_iscsi_connection(self):
        src = self.c.attach(self.a)[0]
        info = self.legacy_connection(self.b)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertIsNone(self.c.transfer())
        self.assertEqual([src], self.c.attachments)

    def test_beside_an_orphan_it_moves_the_volume_until_terminated(self):
        # Instance I runs on node-a; its owner reserves an attachment for
        # I (the override lets it) and asks for a connection from node-b.
        src = self.c.attach(self.a)[0]
        self.reserve()
        info = self.legacy_connection(self.b)
        self.assertEqual('local', info['driver_volume_type'])
        t = self.c.transfer()
        # I's attachment on node-a keeps it cloned: no hydration, every
        # write of I still goes to node-a's copy, nothing is lost.
        self.assertEqual(move.CLONED, t.state)
        self.c.settle()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        # The cure: terminate that connection (os-terminate_connection
        # with the same connector): the move rolls back.
        self.legacy_termination(self.b)
        self.assertEqual([], self.c.violations)
        self.assertIsNone(self.a.source.load(VOLUME_ID))
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertIn(src, self.c.attachments)

    def test_beside_an_orphan_the_instances_detach_commits_it(self):
        # Left alone, the move commits when I's attachment on node-a is
        # deleted (as a live migration's source detach): the volume then
        # lives on node-b, whole.
        src = self.c.attach(self.a)[0]
        orphan = self.reserve()
        self.legacy_connection(self.b)
        self.c.detach(src)
        self.c.detach(orphan)
        self.c.settle()
        self.c.assert_completed()
