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

"""Both sides of a move, over two in-memory nodes (tests.harness.fake_cluster).

Each node runs the real source, destination, peer endpoint, recovery and
hydration tracker (cinder_dmclone.service.MoveService); only the kernel,
LVM, the iSCSI initiator and target, the database and the RPC transport
are fakes.

The last test case injects a crash into every step of the destination's
flow and checks that recovery ends in a consistent state.
"""

import collections
import contextlib
import threading
from unittest import mock

import ddt
from oslo_db import exception as db_exc
import oslo_messaging
from tooz import coordination as tooz_coordination

from cinder import context
from cinder import coordination
from cinder import exception
from cinder import objects
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_volume
from cinder.tests.unit import test
from cinder.volume import api as volume_api

from cinder_dmclone import attachments
from cinder_dmclone import destination as dmc_destination
from cinder_dmclone import dmsetup
from cinder_dmclone import driver as dmc_driver
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import hydration
from cinder_dmclone import move
from cinder_dmclone import peer
from cinder_dmclone import privileged
from cinder_dmclone import recovery
from cinder_dmclone import side
from cinder_dmclone import source as dmc_source
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import HANDLE_PATH
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import LV_PATH
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import SECTORS
from tests.harness.fake_cluster import VOLUME_ID
from tests.harness import manager_flow
from tests.unit import fakes

ATTACHED = fields.VolumeAttachStatus.ATTACHED
ATTACHING = fields.VolumeAttachStatus.ATTACHING
RESERVED = fields.VolumeAttachStatus.RESERVED
DETACHED = fields.VolumeAttachStatus.DETACHED
META_PATH = '/dev/%s/%s' % (fake_cluster.VG, META)
IQN = 'iqn.2010-10.org.openstack:%s' % LV
INSTANCE2_ID = '0a4ff1ce-1d1b-4f7c-a5b3-9c87a3b8c1f2'


@contextlib.contextmanager
def testtools_raises(test, exc_class):
    """assertRaises as a context manager (testtools has none)."""
    try:
        yield
    except exc_class:
        return
    test.fail('%s not raised' % exc_class.__name__)


def attachment(status, instance=fake.INSTANCE_ID, host=None,
               connector=None):
    return objects.VolumeAttachment(
        id=fake.ATTACHMENT_ID, instance_uuid=instance, attach_status=status,
        attached_host=host, connector=connector)


def volume_with(*attachments):
    volume = fake_volume.fake_volume_obj(context.get_admin_context())
    volume.volume_attachment = objects.VolumeAttachmentList(
        objects=list(attachments))
    return volume


@ddt.ddt
class HelpersTestCase(test.TestCase):

    @ddt.data((RESERVED, fake.INSTANCE_ID, True),
              (ATTACHING, fake.INSTANCE_ID, True),
              (ATTACHED, fake.INSTANCE_ID, False),
              (DETACHED, fake.INSTANCE_ID, False),
              (RESERVED, None, False),
              (ATTACHING, None, False))
    @ddt.unpack
    def test_is_instance_attach(self, status, instance, expected):
        self.assertEqual(expected, attachments.is_instance_attach(
            volume_with(attachment(status, instance))))

    def test_is_instance_attach_without_attachments(self):
        self.assertFalse(attachments.is_instance_attach(volume_with()))

    def test_attachments_on(self):
        volume = volume_with(
            attachment(ATTACHED, host='node-a'),
            attachment(ATTACHING, connector={'host': 'node-a'}),
            attachment(ATTACHED, host='node-b'),
            attachment(RESERVED, host='node-a'),
            attachment(DETACHED, host='node-a'),
            attachment(ATTACHED, host=None, connector=None))
        self.assertEqual(2, attachments.on(volume, 'node-a'))
        self.assertEqual(1, attachments.on(volume, 'node-b'))
        self.assertEqual(0, attachments.on(volume, 'node-c'))
        self.assertEqual(0, attachments.on(volume_with(), 'node-a'))

    def test_lock(self):
        get_lock = coordination.COORDINATOR.get_lock
        get_lock.reset_mock()
        self.assertIs(get_lock.return_value, move.lock(VOLUME_ID))
        get_lock.assert_called_once_with('dmclone-%s' % VOLUME_ID)


class ClusterTestCase(test.TestCase):
    """Base: node-a holds the volume, node-b is where it may move."""

    def setUp(self):
        super().setUp()
        self.c = fake_cluster.Cluster(self)
        self.a = self.c.a
        self.b = self.c.b
        # One log for both sides, recovery and the monitor, as the
        # service's log is one.
        self.log = mock.Mock()
        for module in (side, dmc_source, dmc_destination, recovery,
                       hydration):
            self.mock_object(module, 'LOG', self.log)

    def volume(self):
        return self.c.volume()

    def clone_opened_after_build(self):
        """Node-b's new clone is opened right after its build (by udev).

        (blkid, LVM autoactivation, mdadm --incremental: race 2 of
        thin-map.rst.)  No region of an open clone may be discarded.
        """
        build = self.b.dest.build_clone

        def build_then_open(*args, **kwargs):
            path = build(*args, **kwargs)
            self.b.dm.openers[HANDLE] = 1
            return path
        self.mock_object(self.b.dest, 'build_clone',
                         side_effect=build_then_open)

    def zeroing_off_after_the_map(self):
        """Node-b's pool stops zeroing once the map's discards ran."""
        apply_map = self.b.dest.apply_map

        def then_zeroing_off(t, needed):
            skipped = apply_map(t, needed)
            self.b.pool.zeroing = False
            return skipped
        self.mock_object(self.b.dest, 'apply_map',
                         side_effect=then_zeroing_off)

    def name_id_volume(self):
        """Give the volume another id: its LV is no longer named after it.

        (As a _name_id after a generic migration leaves it: see
        Cluster.give_name_id.)  Returns the new id.
        """
        return self.c.give_name_id()

    def saved(self, state=move.PREPARING, dest='node-b', **progress):
        """A transfer as the source saves it, with its export for node-b."""
        volume = self.volume()
        self.a.target.create_export(self.c.ctxt, volume, HANDLE_PATH)
        self.a.target.initialize_connection(volume, self.b.props)
        t = move.Move(
            volume_id=VOLUME_ID, lv_name=LV, state=state,
            source_host=self.a.host, dest_host='%s@dmclone#dmclone' % dest,
            source_node='node-a', dest_node=dest,
            region_sectors=fake_cluster.REGION, clone_sectors=SECTORS,
            target_portal='10.0.0.1:3260', target_iqn=IQN)
        self.a.store.save(self.c.ctxt, t)
        if progress:
            self.c.db.admin_metadata[VOLUME_ID].update(
                {'dmclone_' + k: v for k, v in progress.items()})
        return t

    def moved(self, live=False):
        """A volume moved to node-b (cloned if ``live``, else hydrating)."""
        src = self.c.attach(self.a)[0] if live else None
        dst = self.c.attach(self.b)[0]
        return src, dst

    def ops(self):
        return [call[2]['op'] if call[2] else None
                for call in self.c.rpc.calls]

    def extend_on(self, node):
        """The driver's extend to 2 GiB on ``node`` (Destination.extend)."""
        return node.destination.extend(
            self.volume(), lambda: node.vg.extend_volume(LV, '2g'))

    def features(self):
        return dmsetup.parse_clone_table(
            self.b.dm.devices[HANDLE][0]).features

    def exported_at_logout(self):
        """At each of node-b's logouts: did node-a still export the volume?

        A real logout from a target that is gone waits out open-iscsi's
        replacement timeout (two minutes).
        """
        seen = []
        disconnect = self.b.connector.disconnect_volume

        def watched(props, *args, **kwargs):
            if props['target_iqn'] in self.b.connector.sessions:
                seen.append(props['target_iqn'] in self.a.target.exports)
            return disconnect(props, *args, **kwargs)
        self.mock_object(self.b.connector, 'disconnect_volume',
                         side_effect=watched)
        return seen


class WantsMoveTestCase(ClusterTestCase):

    def reserved(self, instance=fake.INSTANCE_ID):
        self.c.attachments.append({
            'id': fake.ATTACHMENT_ID, 'instance_uuid': instance,
            'attach_status': RESERVED, 'attached_host': None,
            'connector': None})
        return self.volume()

    def test_instance_attach_elsewhere(self):
        volume = self.reserved()
        self.assertTrue(self.a.source.wants_move(volume, self.b.props))

    def test_attach_without_instance(self):
        # cinder-backup, image upload: an ordinary iSCSI attach.
        volume = self.reserved(instance=None)
        self.assertFalse(self.a.source.wants_move(volume, self.b.props))

    def test_local_attach(self):
        volume = self.reserved()
        self.assertFalse(self.a.source.wants_move(volume, self.a.props))

    def test_backup_attach_is_iscsi(self):
        att, info = self.c.attach(self.b, instance_uuid=None)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIsNone(self.c.transfer())


class DestinationHostTestCase(ClusterTestCase):

    def test_found(self):
        self.assertEqual(
            ('node-b@dmclone#dmclone', 'az-node-b'),
            dmc_source.service_host(self.c.ctxt, self.volume(),
                                    'node-b'))
        objects.Service.get_by_args.assert_called_once_with(
            self.c.ctxt, 'node-b@dmclone', 'cinder-volume')

    def test_pool_is_kept(self):
        volume = self.volume()
        volume.host = 'node-a@dmclone#pool-1'
        self.assertEqual(
            'node-b@dmclone#pool-1',
            dmc_source.service_host(self.c.ctxt, volume, 'node-b')[0])

    def test_no_service(self):
        self.b.has_service = False
        self.assertEqual((None, None), dmc_source.service_host(
            self.c.ctxt, self.volume(), 'node-b'))

    def test_down(self):
        self.b.service_up = False
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                dmc_source.service_host, self.c.ctxt,
                                self.volume(), 'node-b')
        self.assertIn('node-b@dmclone is down or disabled', str(exc))
        self.assertIn(VOLUME_ID, str(exc))

    def test_disabled(self):
        self.b.disabled = True
        self.assertRaises(exception.VolumeBackendAPIException,
                          dmc_source.service_host, self.c.ctxt,
                          self.volume(), 'node-b')


class MoveTestCase(ClusterTestCase):

    def test_move_hydrates_at_once(self):
        states = []
        prepare = self.b.destination.prepare

        def prepare_seeing_state(volume, step):
            states.append(self.c.transfer().state)
            return prepare(volume, step)
        self.b.destination.prepare = prepare_seeing_state
        att, info = self.c.attach(self.b)
        self.assertEqual({'driver_volume_type': 'local',
                          'data': {'device_path': HANDLE_PATH,
                                   'volume_id': VOLUME_ID,
                                   'access_mode': 'rw'}}, info)
        # Saved as preparing before the destination was asked.
        self.assertEqual([move.PREPARING], states)
        t = self.c.transfer()
        self.assertEqual([('initialize_connection', 'node-b@dmclone#dmclone',
                           {'op': 'prepare', 'hydrate': True,
                            'size_gb': 1, 'secret': t.secret})],
                         self.c.rpc.calls)
        self.assertEqual(32, len(t.secret))
        self.assertEqual(move.HYDRATING, t.state)
        self.assertEqual(('node-a', 'node-b'), (t.source_node, t.dest_node))
        self.assertEqual(SECTORS, t.clone_sectors)
        self.assertEqual(fake_cluster.REGION, t.region_sectors)
        self.assertEqual(('10.0.0.1:3260', IQN, 0),
                         (t.target_portal, t.target_iqn, t.target_lun))
        self.assertEqual({'host': self.b.host, 'availability_zone':
                          self.b.az},
                         {k: self.c.db.volumes[VOLUME_ID][k]
                          for k in ('host', 'availability_zone')})
        # The ACL of the source's export admits the destination only.
        self.assertEqual({self.b.props['initiator']},
                         self.a.target.exports[IQN]['acl'])
        self.assertNotIn('no_hydration', self.features())
        self.assertEqual([], self.c.violations)

    def test_move_back_while_the_old_copy_is_still_being_wiped(self):
        # node-a's old copy is renamed <lv>-dmcwipe-<hex> when it is
        # retired and wiped in the background; a move back meanwhile
        # builds a fresh LV beside it (no old copy of that name here).
        wipes = []
        self.a.wiper._spawn = lambda fn, *args: wipes.append((fn, args))
        att, _info = self.c.attach(self.b)
        self.c.settle()
        self.c.assert_no_transfer()
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual(1, len(wipes))
        self.assertNotIn(LV, self.a.vg.lvs)
        self.c.detach(att)
        self.c.attach(self.a)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        for fn, args in wipes:
            fn(*args)
        self.c.settle()
        self.assertEqual([], self.c.violations)
        self.c.assert_no_transfer()
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual([LV], list(self.a.vg.lvs))
        self.assertTrue(self.a.vg.lvs[LV]['complete'])

    def test_attachment_created_after_the_volume_was_loaded(self):
        # Nova's live migration creates the destination's attachment with
        # its connector: the Volume the manager passes was loaded before
        # the attachment was reserved.  The database decides.
        self.c.attachments.append({
            'id': fake.ATTACHMENT2_ID, 'instance_uuid': fake.INSTANCE_ID,
            'attach_status': ATTACHED, 'attached_host': 'node-a',
            'connector': None})
        stale = self.volume()
        self.c.attachments.append({
            'id': fake.ATTACHMENT_ID, 'instance_uuid': fake.INSTANCE_ID,
            'attach_status': RESERVED, 'attached_host': None,
            'connector': None})
        self.assertFalse(attachments.is_instance_attach(stale))
        self.assertTrue(self.a.source.wants_move(stale, self.b.props))

    def test_live_migration_does_not_hydrate(self):
        self.moved(live=True)
        self.assertFalse(self.c.rpc.calls[0][2]['hydrate'])
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertIn('no_hydration', self.features())
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])

    def test_attachment_under_an_alias_does_not_hydrate(self):
        self.a.source.node_names = {'node-a', 'node-a.example.org'}
        self.c.attachments.append({
            'id': fake.ATTACHMENT2_ID, 'instance_uuid': fake.INSTANCE_ID,
            'attach_status': ATTACHED, 'attached_host': 'node-a.example.org',
            'connector': None})
        self.c.attach(self.b)
        self.assertEqual(move.CLONED, self.c.transfer().state)

    def test_source_lv_smaller_than_the_record_is_refused(self):
        self.c.db.volumes[VOLUME_ID]['size'] = 2
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('its record says 2 GiB', str(exc))
        self.assertEqual([], self.ops())
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.a.target.exports)
        self.assertEqual({}, self.b.vg.lvs)

    def test_destination_failure_leaves_the_volume(self):
        self.b.vg.fail_on['create_volume'] = \
            exception.VolumeBackendAPIException(data='VG full')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.assert_rolled_back()
        self.assertEqual({}, self.a.target.exports)
        self.assertEqual(['prepare', 'abort'], self.ops())
        self.log.error.assert_called()

    def test_destination_down(self):
        self.b.down = True
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        # The abort could not be delivered: logged, not raised, and the
        # transfer kept as aborted for node-b to clean up.
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual({}, self.a.target.exports)
        self.log.exception.assert_called()
        # Aborted is not moving: the volume is usable on node-a.
        self.assertIsNone(self.a.source.load(VOLUME_ID))
        self.a.source.refuse_if_moving(self.volume(), 'x')
        self.c.restart(self.b)
        # node-b built nothing, so nothing there names the volume: the
        # inert state stays until node-a next moves or deletes it.
        self.c.assert_rolled_back(aborted_ok=True)
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_refuses_while_in_flight(self):
        self.saved(move.HYDRATING, dest='node-c', percent='42.0')
        exc = self.assertRaises(move.MoveInProgress,
                                self.a.source.move, self.volume(),
                                self.b.props, lambda: SECTORS)
        for text in ('node-a', 'node-c', 'hydrating', '42.0%',
                     'attaching on node-b'):
            self.assertIn(text, str(exc))
        self.assertEqual([], self.c.rpc.calls)
        self.assertEqual('node-c', self.c.transfer().dest_node)

    def test_refuses_with_snapshots(self):
        self.c.snapshots = [mock.sentinel.snapshot]
        exc = self.assertRaises(exception.InvalidVolume, self.a.source.move,
                                self.volume(), self.b.props, lambda: SECTORS)
        self.assertIn('1 snapshot(s) on node node-a', str(exc))
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.a.target.calls)

    def test_no_service_on_destination(self):
        self.b.has_service = False
        # (Reserved by Cinder before it asks for the connection.)
        self.c.attachments.append({
            'id': fake.ATTACHMENT_ID, 'instance_uuid': fake.INSTANCE_ID,
            'attach_status': RESERVED, 'attached_host': None,
            'connector': None})
        self.assertIsNone(self.a.source.move(self.volume(), self.b.props,
                                             lambda: SECTORS))
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.a.target.calls)

    def test_destination_service_down(self):
        self.b.service_up = False
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.a.source.move, self.volume(), self.b.props,
                          lambda: SECTORS)
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.c.rpc.calls)

    def test_takes_the_volume_lock(self):
        self.c.attach(self.b)
        move.lock.assert_any_call(VOLUME_ID)

    def test_racing_attaches_have_one_winner(self):
        # A second instance attach (from a third node) arrives while the
        # first move is being built.  With a real lock it waits, then gets
        # a clear error naming the transfer; the first move completes.
        locks = collections.defaultdict(threading.Lock)
        self.mock_object(move, 'lock', side_effect=lambda n: locks[n])
        errors = []
        prepare = self.b.destination.prepare

        def second_attach():
            other = dict(self.b.props, host='node-c',
                         initiator='iqn.2024-01.org.example.nodec:i')
            try:
                self.a.source.move(self.volume(), other, lambda: SECTORS)
            except move.MoveInProgress as exc:
                errors.append(str(exc))
        racer = threading.Thread(target=second_attach)

        def prepare_while_another_attach_arrives(volume, step):
            racer.start()
            racer.join(0.2)
            self.assertTrue(racer.is_alive())      # blocked on the lock
            return prepare(volume, step)
        self.b.destination.prepare = prepare_while_another_attach_arrives
        self.c.attach(self.b)
        racer.join(10)
        self.assertFalse(racer.is_alive())
        self.assertEqual(1, len(errors))
        self.assertIn('moving from node-a to node-b', errors[0])
        self.assertIn('attaching on node-c', errors[0])
        t = self.c.transfer()
        self.assertEqual(('node-b', move.HYDRATING),
                         (t.dest_node, t.state))


class PrepareTestCase(ClusterTestCase):

    def test_space_checked_and_taken_under_the_vgs_lock(self):
        # Review 7, R7-4: a second move's check must see the first one's
        # LVs: check and creation run under one lock of the VG.
        events = []
        lock = mock.MagicMock()
        lock.__enter__.side_effect = lambda: events.append('lock')
        lock.__exit__.side_effect = lambda *exc: events.append('unlock')
        space_lock = self.mock_object(move, 'space_lock', return_value=lock)
        for step in ('check_space', 'create_volumes'):
            real = getattr(self.b.dest, step)
            self.mock_object(
                self.b.dest, step,
                side_effect=lambda *a, _real=real, _step=step: (
                    events.append(_step), _real(*a))[1])
        self.c.attach(self.b)
        space_lock.assert_called_once_with(fake_cluster.VG)
        self.assertEqual(['lock', 'check_space', 'create_volumes', 'unlock'],
                         events)

    def prepare(self, **step):
        volume = self.volume()
        volume.provider_auth = 'CHAP user s3cret'
        t = self.c.transfer()
        step.setdefault('secret', t.secret if t else None)
        return self.b.destination.prepare(volume, dict(step, op='prepare'))

    def test_no_transfer(self):
        exc = self.assertRaises(dmc_exception.StepRefused, self.prepare)
        self.assertIn('no transfer of this volume is recorded', str(exc))

    def test_forged_secret(self):
        self.saved()
        exc = self.assertRaises(dmc_exception.StepRefused, self.prepare,
                                secret='0' * 32)
        self.assertIn('secret', str(exc))
        self.assertEqual({}, self.b.vg.lvs)
        self.assertRaises(dmc_exception.StepRefused, self.prepare,
                          secret=None)
        self.assertEqual({}, self.b.vg.lvs)

    def test_wrong_state(self):
        self.saved(move.CLONED)
        self.assertRaises(exception.VolumeBackendAPIException, self.prepare)
        self.assertEqual({}, self.b.vg.lvs)

    def test_other_destination(self):
        self.saved(dest='node-c')
        self.assertRaises(dmc_exception.StepRefused, self.prepare)
        self.assertEqual({}, self.b.vg.lvs)

    def test_builds_without_hydration(self):
        self.saved()
        self.assertEqual(HANDLE_PATH, self.prepare(hydrate=False, size_gb=1))
        # The source records the outcome once this answer reaches it.
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertIn('no_hydration', self.features())
        self.assertEqual({'hydration_threshold': 64,
                          'hydration_batch_size': 16},
                         dmsetup.parse_clone_table(
                             self.b.dm.devices[HANDLE][0]).core_args)
        props = self.b.connector.calls[-1][1]
        self.assertEqual('s3cret', props['auth_password'])

    def test_builds_with_hydration(self):
        self.saved()
        self.prepare(hydrate=True)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertNotIn('no_hydration', self.features())

    def test_size_from_step_or_volume(self):
        self.saved()
        self.prepare()
        self.assertIn(('create_volume', LV, '1g', 'default'),
                      self.b.vg.calls)
        self.b.dest.tear_down(self.c.transfer(), None)
        self.prepare(size_gb=2)
        self.assertIn(('create_volume', LV, '2g', 'default'),
                      self.b.vg.calls)

    def given_up_during_build(self, give_up):
        """node-a gives up (``give_up(t)``) while node-b builds."""
        self.saved()
        t = self.c.transfer()
        build = self.b.dest.build_clone

        def slow_build(*args, **kwargs):
            path = build(*args, **kwargs)
            give_up(t)
            return path
        self.mock_object(self.b.dest, 'build_clone', side_effect=slow_build)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.prepare)
        self.assertIn('given up by its source', str(exc))
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)

    def test_source_recorded_aborted_during_the_build(self):
        self.given_up_during_build(lambda t: self.a.store.transition(
            self.c.ctxt, t, (move.PREPARING,), move.ABORTED))
        # Not overwritten with "cloned"; the inert keys are cleared too.
        self.assertIsNone(self.c.transfer())
        self.log.warning.assert_called()

    def test_source_cleared_the_move_during_the_build(self):
        self.given_up_during_build(
            lambda t: self.a.store.clear(self.c.ctxt, VOLUME_ID))
        self.assertIsNone(self.c.transfer())

    def test_failure_tears_down(self):
        self.saved()
        self.a.target.exports.clear()
        self.assertRaises(exception.VolumeBackendAPIException, self.prepare)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)
        # The source decides what becomes of its transfer.
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.log.exception.assert_called()

    def test_full_destination_refuses_before_building(self):
        self.saved()
        self.b.vg.vg_free_space = 0.25
        exc = self.assertRaises(dmc_exception.DestinationFull, self.prepare,
                                size_gb=1)
        self.assertIn('node-b cannot take volume %s' % VOLUME_ID, str(exc))
        self.assertNotIn(('create_volume', LV, '1g', 'default'),
                         self.b.vg.calls)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.connector.sessions)

    def thin_destination(self, data_percent):
        """node-b runs thin: a 100 GiB pool, ``data_percent`` used."""
        dest = self.b.dest
        dest.lvm_type = 'thin'
        report = '  %s|%d|%.2f|1.00|%d|65536|\n' % (
            dest.thin_pool, 100 * 1024 ** 3, data_percent, 100 * 1024 ** 2)
        execute = dest._execute

        def lvs_or_execute(*cmd, **kwargs):
            if cmd[2] == 'lvs':
                # (The pool, and the group's LVs: LVM's own listing.)
                return report + ''.join(
                    '  %s|%d|||||\n' % (name, lv['bytes'])
                    for name, lv in sorted(self.b.vg.lvs.items())), ''
            return execute(*cmd, **kwargs)
        dest._execute = lvs_or_execute

    def test_full_thin_pool_refuses_before_building(self):
        # The move would hydrate all of the 1 GiB volume into a pool with
        # 0.5 GiB free.  (Before: a thin pool was never checked.)
        self.saved()
        self.thin_destination(99.5)
        exc = self.assertRaises(dmc_exception.ThinPoolFull, self.prepare,
                                size_gb=1)
        self.assertIn('node-b cannot take volume %s' % VOLUME_ID, str(exc))
        self.assertEqual([], self.b.vg.calls)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.connector.sessions)

    def test_a_volume_moves_into_a_thin_pool_with_room(self):
        self.thin_destination(40.0)
        self.c.attach(self.b)
        self.assertIn(('create_volume', LV, '1g', 'thin'), self.b.vg.calls)
        self.c.settle()
        self.c.assert_completed()

    def test_leftovers_of_an_abandoned_attempt_are_not_reused(self):
        # An earlier attempt hydrated part of a clone here, then the source
        # gave up and cleared the transfer (e.g. an RPC timeout).
        t = self.saved()
        self.prepare(hydrate=True)
        self.b.dm.hydrate(HANDLE, 1000)
        self.a.store.clear(self.c.ctxt, VOLUME_ID)
        # The next attempt must not trust those regions: the source may
        # have been written since.
        self.a.store.save(self.c.ctxt, t)
        self.prepare(hydrate=True)
        status = self.b.dm.status(HANDLE)[0].clone
        self.assertEqual(0, status.hydrated_regions)
        self.assertEqual(1, self.b.vg.lvs[META]['zeroed'])
        self.assertEqual([], self.c.violations)


class DetachedTestCase(ClusterTestCase):

    def test_commit_on_source_detach(self):
        src, dst = self.moved(live=True)
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertTrue(self.b.dm.hydration[HANDLE])
        # The source keeps its LV until the transfer retires it.
        self.assertIn(LV, self.a.vg.lvs)
        self.c.settle()
        self.c.assert_completed()

    def test_no_commit_while_the_source_holds_another_attachment(self):
        other = self.c.attach(self.a, instance_uuid=INSTANCE2_ID)[0]
        src, dst = self.moved(live=True)
        self.c.detach(src)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        self.c.detach(other)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_no_commit_while_an_instance_on_the_source_holds_it(self):
        # An owner deletes the source's attachment through the API during
        # a live migration while the instance on node-a still runs: its
        # handle is open.  Committing would hydrate node-b from a copy
        # that still changes, then retire it with every later write.
        # (Failed before the source was asked: the move committed.)
        src, dst = self.moved(live=True)
        self.a.dm.openers[HANDLE] = 1
        self.a.source.CLOSE_WAIT = 0
        self.c.detach(src)      # succeeds: Nova would not retry it
        self.assertEqual('closed', self.ops()[-1])
        self.c.settle()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        self.assertIn(LV, self.a.vg.lvs)
        self.assertTrue(any('does not confirm' in str(c)
                            for c in self.log.warning.call_args_list))
        # The instance leaves node-a (its process ends): the next tick
        # commits.
        self.a.dm.openers[HANDLE] = 0
        self.c.settle()
        self.c.assert_completed()

    def test_lios_export_to_the_destination_is_not_a_user(self):
        # The export node-b hydrates from holds the handle open too.
        src, dst = self.moved(live=True)
        self.a.dm.openers[HANDLE] = 1
        self.a.source._lio_openers = (
            lambda path: 1 if path == HANDLE_PATH else 0)
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_source_waits_for_its_last_user_to_let_go(self):
        # The instance's process is still exiting when Nova deletes the
        # attachment: the source waits for the handle to close.
        src, dst = self.moved(live=True)
        self.a.dm.openers[HANDLE] = 1
        clock = iter(range(100))
        self.a.source._clock = lambda: next(clock)

        def sleep(seconds):
            self.a.dm.openers[HANDLE] = 0
        self.a.source._sleep = sleep
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_no_commit_without_the_sources_answer(self):
        src, dst = self.moved(live=True)
        self.a.down = True      # its service restarting, say
        self.c.detach(src)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        # In the record too, for the status tool and another process.
        self.assertEqual('node-a', self.c.transfer_keys()[
            'dmclone_awaiting_source'])
        self.c.tick(self.b)
        self.assertEqual('node-a', self.c.transfer_keys()[
            'dmclone_awaiting_source'])
        self.a.down = False
        self.c.now += 60            # (past the rest after a timeout)
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertNotIn('dmclone_awaiting_source', self.c.transfer_keys())
        self.c.settle()
        self.c.assert_completed()

    def test_rollback_on_destination_detach(self):
        src, dst = self.moved(live=True)
        self.c.detach(dst)
        self.c.assert_rolled_back()
        self.assertEqual('release', self.ops()[-1])
        self.assertEqual({}, self.a.target.exports)
        self.assertEqual([src], self.c.attachments)
        self.log.warning.assert_called()

    def test_rollback_keeps_zone_when_source_service_unknown(self):
        src, dst = self.moved(live=True)
        self.a.has_service = False
        self.c.detach(dst)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        # No service to ask: the record keeps the zone it had.
        self.assertEqual(self.b.az,
                         self.c.db.volumes[VOLUME_ID]['availability_zone'])

    def test_rollback_survives_source_failure(self):
        src, dst = self.moved(live=True)
        self.a.down = True
        self.c.detach(dst)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.log.exception.assert_called()

    def test_not_a_transfer(self):
        self.assertFalse(self.b.destination.detached(self.volume(),
                                                     self.a.props))

    def test_not_in_cloned_state(self):
        self.moved()
        # The source's connection ended with the commit: a (retried)
        # detach from it is handled as a no-op; anything else is not ours.
        self.assertTrue(self.b.destination.detached(self.volume(),
                                                    self.a.props))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertFalse(self.b.destination.detached(self.volume(),
                                                     self.b.props))

    def test_not_the_destination(self):
        self.moved(live=True)
        self.assertFalse(self.a.destination.detached(self.volume(),
                                                     self.a.props))

    def test_detach_elsewhere(self):
        self.moved(live=True)
        self.assertFalse(self.b.destination.detached(self.volume(),
                                                     {'host': 'node-c'}))
        self.assertFalse(self.b.destination.detached(self.volume(), None))
        self.assertEqual(move.CLONED, self.c.transfer().state)

    def test_destination_detach_without_source_attachment(self):
        self.moved(live=True)
        self.c.attachments = [a for a in self.c.attachments
                              if a['attached_host'] == 'node-b']
        self.assertFalse(self.b.destination.detached(self.volume(),
                                                     self.b.props))
        self.assertEqual(move.CLONED, self.c.transfer().state)

    def test_detach_that_lost_the_race_for_the_lock(self):
        # Another detach committed the move while this one waited for the
        # lock: it reads the state again and does nothing more.
        src, dst = self.moved(live=True)
        cloned = self.c.transfer()
        self.c.detach(src)
        self.mock_object(self.b.destination, 'load',
                         side_effect=[cloned, self.c.transfer()])
        enable = self.mock_object(self.b.dest, 'enable_hydration')
        self.assertTrue(self.b.destination.detached(
            self.volume(), self.a.props))
        enable.assert_not_called()
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    # -- a destination that took writes is never rolled back -------------
    def test_destination_that_took_writes_is_kept(self):
        # The migration switched over (the instance wrote on node-b), but
        # the source's attachment outlived it (its compute died before
        # cleaning up).  A detach on node-b must not discard the writes.
        # (Before: rolled back, node-b's LV and every write deleted.)
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 3)
        self.c.detach(dst)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.assertEqual(3, self.b.dm.status(HANDLE)[0].clone
                         .hydrated_regions)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        self.assertNotIn('release', self.ops())
        self.log.error.assert_called_once()
        self.assertIn('attachment delete', self.log.error.call_args[0][0])
        self.c.tick(self.b)
        report = self.b.tracker.progress_report()[VOLUME_ID]
        self.assertTrue(report['stale_source_attachment'])
        self.assertEqual('node-a', self.c.transfer_keys()[
            'dmclone_stale_source_attachment'])
        # The operator removes the stale attachment: the move commits.
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        # (Before: the record kept telling operators to delete it while
        # the move hydrated.)
        self.assertNotIn('dmclone_stale_source_attachment',
                         self.c.transfer_keys())
        self.c.settle()
        self.c.assert_completed()
        self.assertEqual(set(), self.b.destination.held)

    def test_written_clone_is_kept_by_recovery_after_a_reboot(self):
        # The rollback's detach was lost with a reboot of node-b: the
        # clone is rebuilt first, and it says the instance wrote here.
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 2)
        self.c.attachments.remove(dst)
        self.b.reboot()
        self.b.recover()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertEqual(2, self.b.dm.status(HANDLE)[0].clone
                         .hydrated_regions)
        self.assertIn('no_hydration', self.features())
        self.assertEqual({VOLUME_ID}, self.b.destination.held)

    def test_unwritten_clone_is_rolled_back_by_recovery_after_a_reboot(self):
        src, dst = self.moved(live=True)
        self.c.attachments.remove(dst)
        self.b.reboot()
        self.b.recover()
        self.c.assert_rolled_back()

    # -- a clone whose metadata LV is lost ----------------------------
    def lose_metadata(self, writes=0):
        """node-b reboots in the window and its metadata LV is gone.

        (A failed metadata device, or an lvremove by hand.)  Its
        recovery runs; returns the attachments.
        """
        src, dst = self.moved(live=True)
        if writes:
            self.b.dm.write(HANDLE, writes)
        self.b.reboot()
        self.b.vg.delete(META)
        self.b.recover()
        return src, dst

    def test_no_clone_without_its_metadata_after_a_reboot(self):
        # A clone over the data LV with no metadata (or a fresh, zeroed
        # one) would read every region from node-a: the writes made
        # here hidden, and overwritten once hydration runs.
        self.lose_metadata(writes=2)
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.b.dm.devices)
        self.assertNotIn(META, self.b.vg.lvs)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertIn('metadata LV', str(self.log.error.call_args))

    def test_rollback_with_the_metadata_lost_keeps_the_data_lv(self):
        # Nova's rollback of the live migration (the destination detaches
        # while the source holds its attachment).  Without its metadata
        # nothing tells whether the instance ever wrote on node-b: the
        # volume goes back to node-a, whose copy is whole (before: held
        # in ``cloned`` on node-b, where no clone can ever be built
        # again, and told to commit, which cannot work), and node-b's LV
        # is kept, not wiped, for an operator.
        src, dst = self.lose_metadata(writes=2)
        self.c.detach(dst)
        self.assertEqual([], self.c.violations)
        self.c.assert_no_transfer()
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual([LV], list(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertEqual([HANDLE], list(self.a.dm.devices))
        self.assertEqual(set(), self.b.destination.held)
        self.assertIn(LV, self.log.error.call_args[0][1].values())
        # The kept LV blocks a move to node-b until an operator removed
        # it (see Destination.refuse_if_lost_copy) ...
        self.assertRaises(exception.VolumeBackendAPIException, self.c.attach,
                          self.b)
        self.assertIn(LV, self.b.vg.lvs)
        # ... and then the volume moves there again.
        self.b.vg.delete(LV)
        self.c.attach(self.b)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual([], self.c.violations)

    def test_switch_over_with_the_metadata_lost_never_commits(self):
        # The source detaches after node-b lost its metadata LV: no clone
        # can be built over node-b's LV again, so nothing hydrates (before:
        # enable_hydration on a handle that is gone, at every tick).
        src, dst = self.lose_metadata(writes=2)
        self.log.reset_mock()
        self.c.detach(src)
        self.c.settle()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual({}, self.b.dm.devices)
        self.assertNotIn('enable_hydration', str(self.b.dm.calls))
        self.assertEqual(1, str(self.log.error.call_args_list).count(
            'cannot be built again'))
        # The volume is detached on node-b after node-a's detach: its
        # instance ran there, so node-a's copy lacks its writes: the move
        # is kept for an operator, never rolled back; nothing is wiped.
        self.c.detach(dst)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual([LV], list(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)
        self.assertEqual([], self.c.violations)
        self.assertIn('kept in "cloned"', str(self.log.error.call_args))

    def test_lost_rollback_detach_with_the_metadata_lost(self):
        # Nova's rollback detach was lost with the reboot: recovery rolls
        # back, keeping node-b's LV.
        src, dst = self.moved(live=True)
        self.c.attachments.remove(dst)
        self.b.reboot()
        self.b.vg.delete(META)
        self.b.recover()
        self.c.assert_no_transfer()
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual([LV], list(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)

    def test_kept_lv_survives_a_rollback_whose_clear_failed(self):
        # The keep was not durable: the record pointed at node-a, then
        # the clear failed (the detach fails), the move still 'cloned'.
        src, dst = self.lose_metadata(writes=2)
        clear = self.b.store.clear
        failed = []

        def clear_once_failing(*args, **kwargs):
            if not failed:
                failed.append(True)
                raise db_exc.DBConnectionError()
            return clear(*args, **kwargs)
        self.mock_object(self.b.store, 'clear',
                         side_effect=clear_once_failing)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.detach, dst)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertIn(LV, self.b.vg.lvs)
        # Nova retries the detach, on node-a now, whose finish_rollback
        # gives the move up: ABORT to node-b (before: its tear_down of a
        # 'cloned' move wiped the LV it had kept).
        self.c.detach(dst)
        self.c.assert_no_transfer()
        self.assertEqual([], self.b.wiped)
        self.assertIn(LV, self.b.vg.lvs)

    def test_kept_lv_survives_the_sources_restart_after_a_cut_rollback(self):
        src, dst = self.lose_metadata(writes=2)
        self.mock_object(self.b.store, 'clear',
                         side_effect=db_exc.DBConnectionError())
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.detach, dst)
        self.mock_object(self.b.store, 'clear',
                         side_effect=move.Store.clear.__get__(self.b.store))
        # node-a's recovery ABANDONs the 'cloned' move whose record names
        # node-a again -> ABORT to node-b (before: its LV wiped).
        self.a.restart()
        self.a.recover()
        self.assertEqual([], self.b.wiped)
        self.assertIn(LV, self.b.vg.lvs)

    def test_kept_lv_is_reported_at_the_next_start(self):
        src, dst = self.lose_metadata(writes=2)
        self.c.detach(dst)
        self.assertIn(LV, self.b.vg.lvs)
        # The volume's record names node-b's copy ...
        self.assertEqual({'node-b': LV}, move.Store.old_copies_of(
            self.c.db.admin_metadata.get(VOLUME_ID, {})))
        # ... the user deletes the volume (on node-a) ...
        self.c.detach(src)
        self.c.delete()
        del self.c.db.volumes[VOLUME_ID]
        self.assertIn(LV, self.b.vg.lvs)     # the tenant's data, unwiped
        # ... and node-b's next start reports it (before: nothing).
        self.log.reset_mock()
        self.b.restart()
        self.b.recover()
        self.assertIn(LV, str(self.log.mock_calls))

    def test_kept_lv_of_a_live_volume_is_reported_at_the_next_start(self):
        src, dst = self.lose_metadata(writes=2)
        self.c.detach(dst)
        self.log.reset_mock()
        self.b.restart()
        self.b.recover()
        self.assertIn('rolled back after its clone lost its metadata',
                      str(self.log.warning.call_args_list))
        self.assertIn(LV, str(self.log.warning.call_args_list))
        self.assertIn(LV, self.b.vg.lvs)

    def test_local_attach_racing_the_rollback_is_refused(self):
        # An attach on node-b, read by cinder-api while the record named
        # node-b, waits for the lock the rollback detach holds (before:
        # it then mapped the kept LV linearly as the volume).
        src, dst = self.lose_metadata(writes=2)
        stale = self.volume()
        self.assertEqual(self.b.host, stale.host)
        locking = move.lock
        raced = []

        def lock(volume_id):
            if not raced:
                raced.append(volume_id)
                self.c.detach(dst)
            return locking(volume_id)
        self.mock_object(move, 'lock', side_effect=lock)

        def attach_here_as_the_driver_does(volume):
            self.b.source.refuse_local_attach(volume, 'attaching it here')
            drv = mock.Mock(destination=self.b.destination,
                            metadata_vg=None, vg=self.b.vg)
            drv.moves.recovery.pending_rebuild = {}
            dmc_driver.DMCloneVolumeDriver._refuse_linear_over_clone(
                drv, volume)
            return self.b.ensure_handle()
        self.assertRaises(exception.VolumeBackendAPIException,
                          attach_here_as_the_driver_does, stale)
        self.assertNotIn(HANDLE, self.b.dm.devices)

    def test_switch_over_then_lost_metadata_keeps_the_move_for_an_operator(
            self):
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 3)      # the instance runs on node-b
        self.a.down = True              # node-a's service restarting
        self.c.detach(src)              # Nova's post-migration detach
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.b.reboot()                 # node-b crashes ...
        self.b.vg.delete(META)          # ... and its metadata LV is lost
        self.b.recover()
        self.a.down = False
        self.c.detach(dst)              # the instance there is deleted
        # The source detached first: the instance ran on node-b, whose
        # writes node-a's copy lacks: never rolled back to node-a's copy
        # (before: it silently became the volume).
        self.assertNotEqual(self.a.host,
                            self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertEqual([], self.b.wiped)

    def test_rollback_interrupted_after_the_data_lv_went(self):
        # The crash came inside the rollback's teardown, between the data
        # LV and the metadata LV: recovery finishes the rollback.
        src, dst = self.moved(live=True)
        self.c.crash_at(self.b.dest, 'remove_metadata',
                        match=lambda t: True)
        self.c.restart_before_timeout = False
        self.assertRaises(oslo_messaging.MessagingTimeout, self.c.detach,
                          dst)
        self.assertNotIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.c.attachments.remove(dst)
        self.b.reboot()
        self.b.recover()
        self.c.assert_rolled_back()

    def test_detach_retried_after_recovery_finished_the_rollback(self):
        # node-b died after the source released its export; its recovery
        # finished the rollback, so Nova's retry of the detach reaches
        # node-a.  The export is gone: node-a must not ask the target
        # driver to drop node-b's initiator from it (LIO's helper fails:
        # the attachment could never be deleted).
        src, dst = self.moved(live=True)
        self.c.crash_at(self.b.peer, 'request', 'after',
                        lambda *args, **kwargs: args[-2] == peer.RELEASE)
        self.assertRaises(oslo_messaging.MessagingTimeout, self.c.detach,
                          dst)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIsNone(self.c.transfer())
        self.c.detach(dst)
        self.assertEqual([src], self.c.attachments)
        self.c.assert_rolled_back()
        self.c.detach(src)
        self.assertEqual({}, self.a.target.exports)

    # -- the source's other names -------------------------------------------
    def alias_attach(self):
        """node-a's instance attached under its alias node-a.alias."""
        self.a.source.node_names = {'node-a', 'node-a.alias'}
        src = self.c.attach(self.a)[0]
        src['attached_host'] = 'node-a.alias'
        src['connector'] = dict(src['connector'], host='node-a.alias')
        dst = self.c.attach(self.b)[0]
        self.assertEqual(('node-a.alias',), self.c.transfer().source_aliases)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        return src, dst

    def test_source_detach_under_an_alias_commits(self):
        # (Before: node-b did not know the alias, and ran an iSCSI
        # terminate of its own instead of committing.)
        src, dst = self.alias_attach()
        terminations = len(self.b.target.calls)
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertEqual(terminations, len(self.b.target.calls))
        self.c.settle()
        self.c.assert_completed()

    def test_failed_migration_under_an_alias_rolls_back(self):
        # (Before: the source's attachment under its alias was not
        # counted, so nothing was rolled back.)
        src, dst = self.alias_attach()
        self.c.detach(dst)
        self.c.assert_rolled_back()

    def test_lost_detach_counts_the_alias(self):
        # node-b restarts while the instance still runs on node-a under
        # its alias: a commit now would hydrate under a live writer.
        src, dst = self.alias_attach()
        self.c.attachments.remove(dst)
        self.b.restart()
        self.b.recover()
        self.c.assert_rolled_back()


class WithdrawnAttachTestCase(ClusterTestCase):

    def test_attachment_deleted_while_the_move_is_prepared(self):
        # Nova's attach call timed out; it deleted the attachment it had
        # reserved while node-b was still building.  The late success
        # must not move the volume to a node nobody attaches on.
        # (Before: the move was recorded and the volume left node-a.)
        self.c.withdraw_attach_during_build()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('was deleted while the move was prepared', str(exc))
        self.c.assert_rolled_back()

    def test_live_migration_withdrawn_keeps_the_source_attachment(self):
        src = self.c.attach(self.a)[0]
        self.c.withdraw_attach_during_build()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.assert_rolled_back()
        self.assertEqual([src], self.c.attachments)

    def test_the_destination_logs_out_before_the_export_goes(self):
        # node-a gives the move up: node-b removes its clone while the
        # export it reads still exists, then the export goes.  (Before:
        # the export went first, and node-b's logout waited out the
        # replacement timeout inside the abort's call.)
        exported = self.exported_at_logout()
        self.c.withdraw_attach_during_build()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual([True], exported)
        self.c.assert_rolled_back()

    def test_a_destination_dying_in_the_abort_still_ends_clean(self):
        # The abort's call times out (node-b died in it): node-a drops
        # the export and records the move aborted; node-b's recovery
        # removes its side.  (The record stays 'aborted', inert.)
        self.c.withdraw_attach_during_build()
        self.c.crash_at(self.b.destination, 'abort')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertNotIn(IQN, self.a.target.exports)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_an_abort_that_fails_still_drops_the_export(self):
        # node-b answers the abort with an error and keeps its clone:
        # node-a drops the export and records the move aborted; node-b's
        # monitor removes the clone and ends the move.
        self.c.withdraw_attach_during_build()
        abort = self.b.destination.abort
        failures = [exception.VolumeBackendAPIException(data='no')]

        def abort_fails_once(volume, step):
            if failures:
                raise failures.pop()
            return abort(volume, step)
        self.mock_object(self.b.destination, 'abort',
                         side_effect=abort_fails_once)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertNotIn(IQN, self.a.target.exports)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.c.settle()
        self.c.assert_rolled_back()


class ReviewFindingsTestCase(ClusterTestCase):
    """Sequences a hostile review of the hardening found (each failed)."""

    # -- a late step of an earlier move ------------------------------------
    def hooked_build_lock(self, hook):
        real, fired = move.build_lock, []

        @contextlib.contextmanager
        def build_lock(volume_id):
            if not fired:
                fired.append(True)
                hook()
            with real(volume_id):
                yield
        self.mock_object(move, 'build_lock', side_effect=build_lock)

    def retried_move(self, t1):
        """While a step of move 1 waited: move 1 given up, move 2 built."""
        self.c.set_state(t1, move.ABORTED)
        self.c.attach(self.b)
        t2 = self.c.transfer()
        self.assertNotEqual(t1.secret, t2.secret)
        self.assertEqual(move.HYDRATING, t2.state)

    def assert_move_2_intact(self):
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.c.settle()
        self.c.assert_completed()

    def test_late_abort_of_move_1_spares_move_2(self):
        t1 = self.saved()
        self.hooked_build_lock(lambda: self.retried_move(t1))
        connector = dict(self.a.props,
                         dmclone={'op': peer.ABORT, 'secret': t1.secret})
        self.b.endpoint.receive(self.volume(), connector,
                                peer.payload(connector))
        self.assert_move_2_intact()

    def test_late_prepare_of_move_1_spares_move_2(self):
        t1 = self.saved()
        self.hooked_build_lock(lambda: self.retried_move(t1))
        self.assertRaises(dmc_exception.StepRefused,
                          self.b.destination.prepare, self.volume(),
                          {'op': peer.PREPARE, 'secret': t1.secret,
                           'hydrate': True, 'size_gb': 1})
        self.assert_move_2_intact()

    # -- moves recorded by release 1.1.0 -----------------------------------
    def legacy(self):
        md = self.c.db.admin_metadata[VOLUME_ID]
        md.pop('dmclone_secret')
        md.pop('dmclone_source_aliases')
        self.b.restart()
        self.b.recover()

    def test_legacy_hydrating_move_finalizes(self):
        self.moved()
        self.legacy()
        self.c.settle()
        self.c.assert_completed()

    def test_legacy_move_publishes_its_progress(self):
        # A move recorded by 1.1.0 has no secret until a step gives it
        # one: its progress is still shown while it hydrates.
        self.moved()
        self.legacy()
        self.b.dm.hydrate(HANDLE, 4096)
        self.b.monitor.tick()
        self.assertEqual('25.0', self.c.transfer_keys()['dmclone_percent'])

    def test_legacy_cloned_move_commits_on_source_detach(self):
        src, dst = self.moved(live=True)
        self.legacy()
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.c.settle()
        self.c.assert_completed()

    # -- an LV not named after its volume (_name_id) -----------------------
    def test_name_id_volume_found_again_after_a_restart(self):
        # After a generic migration of an in-use volume its LV keeps the
        # temporary volume's name: the LV name is not volume-<id>, and the
        # monitor must not take the clone for an orphan (before: it did,
        # and told the operator to delete the only current copy).
        self.moved()
        db = self.c.db
        other = self.name_id_volume()
        self.b.restart()
        self.b.moves.recovery.recover([self.c.volume(other)], [META])
        self.c.settle()
        self.assertNotIn('dmclone_state', db.admin_metadata[other])
        warnings = [c[0][0] for c in self.log.warning.call_args_list]
        self.assertEqual([], [w for w in warnings if 'no transfer' in w])
        self.c.assert_completed()


class MigrateTestCase(ClusterTestCase):
    """cinder migrate of a detached volume to another node: a move."""

    def test_migrated_volume_hydrates_and_finalizes(self):
        # (Before: Cinder's generic copy through two iSCSI attaches, and
        # the volume unusable until the whole copy was done.)
        self.assertTrue(self.c.migrate(self.b))
        t = self.c.transfer()
        self.assertEqual(move.HYDRATING, t.state)
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        # Usable on node-b at once: its handle is the clone.
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        # Only node-b's initiator may read the source's export.
        acl = self.a.target.exports[IQN]['acl']
        self.assertEqual([self.b.props['initiator']], list(acl))
        self.c.settle()
        self.c.assert_completed()

    def test_failed_build_leaves_the_volume_on_its_node(self):
        self.c.crash_at(self.b.dest, 'build_clone')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('node-b died', str(exc))
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_volume_moving_elsewhere_is_not_migrated(self):
        self.saved(state=move.HYDRATING)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('a migration to node-b is possible once the move has '
                      'finished', str(exc))
        self.assertEqual('error', self.c.db.volumes[VOLUME_ID][
            'migration_status'])

    def test_moving_volume_gets_no_generic_copy_either(self):
        # (Before: (False, None) for another backend before the move was
        # checked, and Cinder's generic copy gave the volume a new
        # _name_id, its LV another name, in the middle of the move.)
        self.saved(state=move.HYDRATING)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b,
                                {'host': 'node-c@lvm#lvm',
                                 'capabilities': {}})
        self.assertIn('a migration to node-c@lvm#lvm is possible once the '
                      'move has finished', str(exc))

    def assert_nothing_changed(self):
        """A refused migration: the volume as before it, on node-a."""
        self.c.assert_rolled_back(aborted_ok=True)
        rec = self.c.db.volumes[VOLUME_ID]
        self.assertEqual('error', rec['migration_status'])
        self.assertIsNone(rec['provider_location'])
        self.assertIsNone(rec['provider_auth'])
        self.assertEqual({}, self.a.target.exports)

    def test_volume_with_snapshots_is_refused(self):
        # (Cinder's API refuses them too: node-local snapshots stay.)
        self.c.snapshots = ['snap']
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('snapshot', str(exc))
        self.assert_nothing_changed()
        self.assertEqual([], self.c.rpc.calls)

    def test_destination_service_down_is_refused(self):
        self.b.service_up = False
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('is down or disabled', str(exc))
        self.assert_nothing_changed()

    def test_full_destination_is_refused(self):
        self.b.vg.vg_free_space = 0.25
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('Node node-b cannot take volume %s' % VOLUME_ID,
                      str(exc))
        self.assert_nothing_changed()

    def test_in_use_volume_is_left_to_cinder(self):
        # Cinder's manager asks no driver for an attached volume: Nova
        # copies it (generic migration), nothing of this backend runs.
        self.c.attach(self.a)
        self.assertFalse(self.c.migrate(self.b))
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.c.rpc.calls)

    def test_detached_multiattach_volume_moves(self):
        # One copy is written at a time: only node-b serves it until it
        # is hydrated, then any node reaches it there over iSCSI.
        self.c.multiattach = True
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a)
        self.c.settle()
        self.c.assert_completed()
        info = self.c.attach(self.a, instance_uuid=INSTANCE2_ID)[1]
        self.assertEqual('iscsi', info['driver_volume_type'])

    def test_manager_records_success(self):
        self.assertTrue(self.c.migrate(self.b))
        rec = self.c.db.volumes[VOLUME_ID]
        self.assertEqual('success', rec['migration_status'])
        self.assertEqual(self.b.az, rec['availability_zone'])
        self.c.settle()
        self.c.assert_completed()

    def test_attach_reserved_since_the_manager_read_is_refused(self):
        # Cinder reserves an attachment of an available volume whatever
        # its migration status; the manager's volume object predates it.
        create_export = self.a.create_export

        def reserve_then_export(*args):
            self.c.attachments.append({
                'id': fake.ATTACHMENT2_ID, 'instance_uuid': INSTANCE2_ID,
                'attach_status': RESERVED, 'attached_host': None,
                'connector': None})
            return create_export(*args)
        self.mock_object(self.a, 'create_export',
                         side_effect=reserve_then_export)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('an attach of it started', str(exc))
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.c.rpc.calls)

    def test_local_attach_racing_the_start_is_refused(self):
        # (R11-1: a local attach on node-a handed out its path before the
        # migration's move was recorded.)  Cinder 29's manager writes the
        # attachment "attaching" only after the driver returned, so until
        # then it looks like an orphan, which holds no commit (R12-2): a
        # local attach is refused while a migration is being started
        # (Source._migration_starting), and the attachment Cinder leaves
        # reserved holds nothing.  (test_orphans has the race in full.)
        att = {'id': fake.ATTACHMENT2_ID, 'instance_uuid': INSTANCE2_ID,
               'attach_status': RESERVED, 'attached_host': None,
               'connector': None}
        record = self.a.source._record
        refused = []

        def local_attach_then_record(*args, **kwargs):
            self.c.attachments.append(att)
            refused.append(self.assertRaises(
                dmc_exception.MigrationStarting, manager_flow.
                initialize_connection, self.a, self.c.ctxt, self.volume(),
                dict(self.a.props), self.a._save))
            return record(*args, **kwargs)
        self.mock_object(self.a.source, '_record',
                         side_effect=local_attach_then_record)
        self.assertTrue(self.c.migrate(self.b))
        self.assertIn('attaching it here is possible once it has finished',
                      str(refused[0]))
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.settle()
        self.c.assert_completed()

    def test_a_source_attachment_holds_the_commit_reported_once(self):
        # A live migration whose source is still attached waits in
        # "cloned"; the monitor says once which attachments hold it.
        src, _dst = self.moved(live=True)
        self.c.settle()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.settle()
        held = [c for c in self.log.warning.call_args_list
                if 'stays cloned' in c[0][0]]
        self.assertEqual(1, len(held))      # once per move
        self.assertEqual(src['id'], held[0][0][1]['ids'])
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()

    def test_a_reserved_attachment_with_no_host_holds_no_commit(self):
        # R12-2: Cinder 29 leaves an attachment reserved with no host when
        # an attachment_create with a connector fails (and a tenant can
        # make one: attachment-create with no connector).  A migration
        # racing one does not hydrate, but the move commits at the next
        # tick: such an attachment has no path (see the test above).
        att = {'id': fake.ATTACHMENT2_ID, 'instance_uuid': INSTANCE2_ID,
               'attach_status': RESERVED, 'attached_host': None,
               'connector': None}
        record = self.a.source._record

        def reserve_then_record(*args, **kwargs):
            self.c.attachments.append(att)
            return record(*args, **kwargs)
        self.mock_object(self.a.source, '_record',
                         side_effect=reserve_then_record)
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.settle()
        self.c.assert_completed()

    def test_a_migration_refusal_names_the_attachments(self):
        # An orphan (reserved, no host) refuses a migration whose manager
        # saw none yet; the message tells how to clear it.
        att = {'id': fake.ATTACHMENT2_ID, 'instance_uuid': INSTANCE2_ID,
               'attach_status': RESERVED, 'attached_host': None,
               'connector': None}
        create_export = self.a.create_export

        def reserve_then_export(*args):
            self.c.attachments.append(att)
            return create_export(*args)
        self.mock_object(self.a, 'create_export',
                         side_effect=reserve_then_export)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('attachment(s) %s' % fake.ATTACHMENT2_ID, str(exc))
        self.assertIn('cinder attachment-delete <id>', str(exc))

    def test_local_attach_after_the_move_is_recorded_is_refused(self):
        # The other order: the move is recorded first.  A local attach
        # then reads the record (and waits for the lock, which the move
        # holds: not modelled in one thread), and is refused.
        record = self.a.source._record
        seen = []

        def record_then_local_attach(*args, **kwargs):
            t = record(*args, **kwargs)
            seen.append(self.a.source.load(VOLUME_ID))
            return t
        self.mock_object(self.a.source, '_record',
                         side_effect=record_then_local_attach)
        self.assertTrue(self.c.migrate(self.b))
        self.assertTrue(self.a.source.is_source(seen[0]))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertRaises(move.MoveInProgress,
                          self.a.source.refuse_local_attach, self.volume(),
                          'attaching it here')


class AttachInFlightTestCase(ClusterTestCase):
    """Source.export_for_attach's record of an iSCSI attach (R12-3)."""

    def initiators(self):
        return [who for who, _when in
                self.a.source.attaches_in_flight.get(VOLUME_ID, ())]

    def test_attach_done_removes_its_own_entry(self):
        src = self.a.source
        node_c = {'host': 'node-c', 'initiator': 'IQN.1993-08.org:c'}
        node_d = {'host': 'node-d', 'initiator': 'iqn.1993-08.org:d'}
        src.export_for_attach(self.volume(), dict, node_c)
        src.export_for_attach(self.volume(), dict, node_d)
        src.attach_done(self.volume(), node_d)
        self.assertEqual(['iqn.1993-08.org:c'], self.initiators())
        src.attach_done(self.volume(), node_c)
        self.assertEqual({}, src.attaches_in_flight)

    def test_an_attach_that_never_connects_is_forgotten(self):
        # (Cinder's _connection_create failed after create_export.)
        src = self.a.source
        self.mock_object(src, '_clock', side_effect=lambda: self.c.now)
        src.export_for_attach(self.volume(), dict,
                              {'host': 'node-c', 'initiator': 'iqn.c'})
        self.assertTrue(src._attach_in_flight(VOLUME_ID))
        self.c.now += src.stale_prepare_after() + 1
        self.assertFalse(src._attach_in_flight(VOLUME_ID))
        self.assertEqual({}, src.attaches_in_flight)

    def test_a_failed_migration_leaves_no_attach_in_flight(self):
        self.c.snapshots.append(mock.sentinel.snapshot)
        self.mock_object(self.a.source, '_refuse_snapshots',
                         side_effect=exception.InvalidVolume(reason='x'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertEqual({}, self.a.source.attaches_in_flight)


class ReserveRulesTestCase(ClusterTestCase):
    """Why an attach's move counts no reserved attachment with no host.

    Source._may_be_used_here: Cinder 29's ``_attachment_reserve``
    (volume/api.py) reserves a non-multiattach volume that is not
    available again only for an instance that has an attachment of it
    already, so no local attach can start while an attach of another
    instance moves it; a multiattach volume never moves on an attach.
    These run Cinder's own code on the harness's volume.
    """

    def reserve(self, instance_uuid):
        vref = self.volume()
        # (Its conditional update to "reserved" wants an available one.)
        self.mock_object(vref, 'conditional_update', return_value=False)
        api = volume_api.API()
        self.mock_object(api.db, 'volume_attach',
                         return_value={'id': fake.ATTACHMENT2_ID})
        self.mock_object(objects.VolumeAttachment, 'get_by_id')
        return api._attachment_reserve(self.c.ctxt, vref, instance_uuid)

    def test_cinder_refuses_another_instances_attach(self):
        for status in ('reserved', 'in-use'):
            self.c.db.volumes[VOLUME_ID]['status'] = status
            self.c.attachments[:] = [{
                'id': fake.ATTACHMENT_ID, 'instance_uuid': fake.INSTANCE_ID,
                'attach_status': RESERVED, 'attached_host': None,
                'connector': None}]
            exc = self.assertRaises(exception.InvalidVolume,
                                    self.reserve, INSTANCE2_ID)
            self.assertIn('current status is %s' % status, str(exc))

    def test_cinder_reserves_again_for_the_same_instance(self):
        # A live migration; also the retry after a failed
        # attachment_create, whose orphan stays reserved (R12-2).
        self.c.db.volumes[VOLUME_ID]['status'] = 'reserved'
        self.c.attachments[:] = [{
            'id': fake.ATTACHMENT_ID, 'instance_uuid': fake.INSTANCE_ID,
            'attach_status': RESERVED, 'attached_host': None,
            'connector': None}]
        self.reserve(fake.INSTANCE_ID)

    def test_a_multiattach_volume_never_moves_on_an_attach(self):
        self.c.multiattach = True
        self.c.attach(self.b)
        self.assertIsNone(self.c.transfer())


class NotMovableTestCase(ClusterTestCase):
    """A volume its own service uses without an attachment does not move."""

    def assert_not_moved(self, exc, reason):
        self.assertIn('cannot move from node node-a now: %s' % reason,
                      str(exc))
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], [c for c in self.c.rpc.calls if c[2]])
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])

    def test_statuses_that_use_the_copy_refuse_an_attach_elsewhere(self):
        for status in ('downloading', 'restoring-backup', 'backing-up',
                       'uploading', 'creating', 'retyping'):
            self.c.db.volumes[VOLUME_ID]['status'] = status
            exc = self.assertRaises(exception.VolumeBackendAPIException,
                                    self.c.attach, self.b)
            self.assert_not_moved(exc, 'its status is %s' % status)

    def test_statuses_of_an_attach_move(self):
        for status in ('reserved', 'in-use'):
            self.c = fake_cluster.Cluster(self)
            self.c.db.volumes[VOLUME_ID]['status'] = status
            self.c.attach(self.c.b)
            self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_a_migration_moves_an_available_volume_only(self):
        self.c.db.volumes[VOLUME_ID]['status'] = 'reserved'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assert_not_moved(exc, 'its status is reserved')

    def test_statuses_a_migration_reaches_the_driver_in(self):
        # Cinder 29: migrate --lock-volume True ("maintenance"), a retype
        # with driver migration ("retyping"); the manager restores the
        # previous status once the driver returned.
        for status, lock in (('available', True), ('retyping', False),
                             ('available', False)):
            self.c = fake_cluster.Cluster(self)
            rec = self.c.db.volumes[VOLUME_ID]
            rec['status'] = status
            seen = []
            move_ = self.c.a.source.move

            def moving(*args, **kwargs):
                seen.append(self.c.db.volumes[VOLUME_ID]['status'])
                return move_(*args, **kwargs)
            self.mock_object(self.c.a.source, 'move', side_effect=moving)
            self.assertTrue(self.c.migrate(self.c.b, lock_volume=lock))
            self.assertEqual(['maintenance' if lock else status], seen)
            self.assertEqual('available', rec['status'])
            self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_a_refused_locked_migration_gets_its_status_back(self):
        self.c.snapshots.append(mock.sentinel.snapshot)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b, lock_volume=True)
        rec = self.c.db.volumes[VOLUME_ID]
        self.assertEqual(('available', 'error'),
                         (rec['status'], rec['migration_status']))
        self.assertIsNone(self.c.transfer())

    def test_an_image_being_written_refuses_a_move(self):
        # Cinder's reserve overwrites "downloading" with "reserved".
        with self.a.source.writing(self.volume(), 'writing an image'):
            exc = self.assertRaises(exception.VolumeBackendAPIException,
                                    self.c.attach, self.b)
            self.assert_not_moved(exc, 'an image is being written to it')
        self.assertEqual({}, dict(self.a.source.writers))
        self.c.attach(self.b)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_no_image_is_written_to_a_moving_volume(self):
        self.c.attach(self.b)
        with testtools_raises(self, move.MoveInProgress):
            with self.a.source.writing(self.volume(), 'writing an image'):
                pass
        self.assertEqual({}, dict(self.a.source.writers))


class NameIdTestCase(ClusterTestCase):
    """A volume whose LV is not named after its id moves like any other.

    After Cinder's generic migration of an in-use volume, the volume's
    ``_name_id`` keeps the temporary volume's id and its LV that
    volume's name: ``volume.name`` is ``LV``, its id another
    (Cluster.give_name_id).  Every step finds the volume by its record,
    and the LV by the name the move recorded: nothing takes the id in
    the LV's name for the volume's.
    """

    def setUp(self):
        super().setUp()
        self.vid = self.c.give_name_id()
        self.assertEqual(LV, self.volume().name)
        self.assertNotEqual(VOLUME_ID, self.vid)

    def test_attach_elsewhere_moves_monitors_and_finalizes(self):
        src, dst = self.moved(live=True)
        t = self.c.transfer()
        self.assertEqual((self.vid, LV), (t.volume_id, t.lv_name))
        # The destination's LV takes the volume's name (its _name_id):
        # the name Cinder computes for it after the move, too.
        self.assertEqual([LV], list(self.b.vg.lvs.keys() - {META}))
        self.c.tick(self.b)
        # The monitor publishes the progress under the volume's id.
        self.assertIn('dmclone_percent', self.c.db.admin_metadata[self.vid])
        self.assertIn(self.vid, self.b.tracker.progress)
        self.assertEqual([], [c for c in self.log.warning.call_args_list
                              if 'abandoned move' in c[0][0]])
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()
        self.assertEqual(LV, self.volume().name)

    def test_migration_is_a_move(self):
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()

    def test_failed_live_migration_rolls_back(self):
        src, dst = self.moved(live=True)
        self.c.detach(dst)
        self.c.assert_rolled_back()

    def test_destination_reboot_rebuilds_and_finalizes(self):
        self.moved()
        self.b.dm.hydrate(HANDLE, 1000)
        self.b.reboot()
        self.b.recover()
        self.assertEqual(1000, self.b.dm.status(HANDLE)[0].clone
                         .hydrated_regions)
        self.c.settle()
        self.c.assert_completed()

    def test_source_reboot_exports_again(self):
        self.moved()
        self.a.reboot()
        self.a.recover()
        export = self.a.target.exports.get(
            fakes.FakeTarget.iqn(self.volume()))
        self.assertIn(self.b.props['initiator'], export['acl'])
        self.c.settle()
        self.c.assert_completed()

    def lose_metadata_and_roll_back(self):
        """A rollback keeps node-b's LV: its clone lost its metadata LV."""
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 2)
        self.b.reboot()
        self.b.vg.delete(META)
        self.b.recover()
        self.c.detach(dst)
        self.assertEqual([LV], list(self.b.vg.lvs))
        self.assertEqual({'node-b': LV}, move.Store.old_copies_of(
            self.c.db.admin_metadata[self.vid]))
        return src

    def test_kept_copy_is_reported_as_the_volumes_at_the_next_start(self):
        # The kept LV is named after the deleted temporary volume: it is
        # the old copy of a volume that exists (before: also reported as
        # the LV of a deleted volume, to be removed by hand).
        self.lose_metadata_and_roll_back()
        self.log.reset_mock()
        self.b.restart()
        self.b.recover()
        warnings = str(self.log.warning.call_args_list)
        self.assertIn('rolled back after its clone lost its metadata',
                      warnings)
        self.assertIn(self.vid, warnings)
        self.assertNotIn('no longer exists', warnings)
        self.assertIn(LV, self.b.vg.lvs)

    def test_kept_copy_of_a_deleted_volume_is_reported_at_the_next_start(
            self):
        src = self.lose_metadata_and_roll_back()
        self.c.detach(src)
        self.c.delete()
        del self.c.db.volumes[self.vid]
        self.log.reset_mock()
        self.b.restart()
        self.b.recover()
        self.assertIn('no longer exists', str(self.log.warning.call_args))
        self.assertIn(LV, self.b.vg.lvs)


class MultiattachTestCase(ClusterTestCase):
    """A multiattach volume never moves: other nodes reach it by iSCSI."""

    def test_second_node_gets_iscsi_and_the_volume_stays(self):
        # (Before: the volume moved to node-b while an instance on node-a
        # still wrote to node-a's copy: two diverging disks.)
        self.c.multiattach = True
        self.c.attach(self.a)
        info = self.c.attach(self.b, instance_uuid=INSTANCE2_ID)[1]
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual([], self.c.rpc.calls)

    def test_first_attach_elsewhere_does_not_move_it_either(self):
        self.c.multiattach = True
        info = self.c.attach(self.b)[1]
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertIsNone(self.c.transfer())


class ThirdNodeTestCase(ClusterTestCase):
    """An attachment on a node outside the move keeps the volume put.

    A node without this backend's service (or any other node) reaches the
    volume over iSCSI, through the source's export of its LV.  Moving the
    volume then would hydrate the destination from a copy that node still
    writes, and retire that copy under it.
    """

    def elsewhere(self, instance=fake.INSTANCE_ID, host='node-c'):
        props = dict(self.b.props, host=host,
                     initiator='iqn.1993-08.org.debian:01:node-c')
        self.c.attachments.append({
            'id': fake.ATTACHMENT2_ID, 'instance_uuid': instance,
            'attach_status': ATTACHED, 'attached_host': host,
            'connector': props})

    def assert_stayed(self, info):
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual({}, self.b.vg.lvs)

    def test_live_migration_from_an_iscsi_node_does_not_move(self):
        # (Before: it moved and hydrated at once while node-c still wrote
        # through node-a's export -- review finding 2 of 2026-11-25.)
        self.elsewhere()
        self.assert_stayed(self.c.attach(self.b)[1])
        # The log says which node keeps it there.
        self.assertIn('node-c', [
            c[0][1].get('hosts') for c in self.log.info.call_args_list
            if 'stays on' in c[0][0]])

    def test_a_reader_elsewhere_keeps_the_volume_put(self):
        # A backup reading over iSCSI on node-c: retiring node-a's copy
        # under it would make the backup read zeros.
        self.elsewhere(instance=None)
        self.assert_stayed(self.c.attach(self.b)[1])

    def test_an_attachment_without_a_host_keeps_the_volume_put(self):
        # No host recorded (a legacy attach): it may be anywhere.
        self.elsewhere(host=None)
        self.c.attachments[-1]['connector'] = None
        self.assert_stayed(self.c.attach(self.b)[1])
        self.assertIn('(no host recorded)', [
            c[0][1].get('hosts') for c in self.log.info.call_args_list
            if 'stays on' in c[0][0]])

    def reserve_on_c(self):
        """The instance's attach on node-c, still reserved.

        (Its owner called attachment create with node-c's connector too:
        Cinder marks it ``attaching`` only after the driver's
        initialize_connection returned.)
        """
        self.c.attachments.append({
            'id': fake.ATTACHMENT2_ID, 'instance_uuid': fake.INSTANCE_ID,
            'attach_status': RESERVED,
            'attached_host': None, 'connector': None})
        return dict(self.b.props, host='node-c',
                    initiator='iqn.1993-08.org.debian:01:node-c')

    def test_an_export_to_an_attach_still_reserved_keeps_the_volume_put(self):
        # F4 of the 2026-11-25 review: node-c's export (its ACL on
        # node-a's target) exists, its attachment is not yet "attaching".
        # (Before: the volume moved, and node-c then wrote to the copy the
        # move retires.)
        props = self.reserve_on_c()
        info = self.a.attach(self.c.volume(), props)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assert_stayed(self.c.attach(self.b)[1])
        acl = self.a.target.exports[IQN]['acl']
        self.assertEqual({props['initiator'], self.b.props['initiator']}, acl)

    def test_an_iscsi_export_once_the_move_is_recorded_is_refused(self):
        # The other order: node-c's attach made its export's target before
        # node-b's move took the lock, and connects after it was recorded.
        # (Before: node-c's initiator was admitted to the copy the move
        # was hydrating from.)
        props = self.reserve_on_c()
        self.a.create_export(self.c.ctxt, self.c.volume(), props)
        self.c.attach(self.b)
        self.assertRaises(move.MoveInProgress, self.a.initialize_connection,
                          self.c.volume(), props)
        acl = self.a.target.exports[IQN]['acl']
        self.assertNotIn(props['initiator'], acl)

    def test_an_iscsi_attachment_on_the_destination_keeps_the_volume_put(
            self):
        # Review of 2026-11-25 (afternoon): node-b already reaches the
        # volume over iSCSI (it stayed put while node-c had an export);
        # node-c's attach goes, and another instance attach on node-b
        # comes.  The ACL names node-b alone, and wants_move did not count
        # node-b's own attachments: the volume moved and hydrated while
        # node-b's first session still wrote to node-a's copy.
        props = self.reserve_on_c()
        self.a.attach(self.c.volume(), props)
        first, info = self.c.attach(self.b)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.c.attachments.remove(self.c.attachments[0])     # node-c's
        self.a.target.terminate_connection(self.c.volume(), props)
        self.assert_stayed(self.c.attach(self.b)[1])
        self.assertIn(first, self.c.attachments)

    def test_an_unreadable_acl_keeps_the_volume_put(self):
        # (configfs not mounted where the service runs: other nodes using
        # the export cannot be ruled out.)
        self.a.source._lio_acls = lambda iqn: frozenset()
        self.assert_stayed(self.c.attach(self.b)[1])

    def test_the_destinations_initiator_compares_case_insensitively(self):
        self.b.props['initiator'] = self.b.props['initiator'].upper()
        info = self.c.attach(self.b)[1]
        self.assertEqual('local', info['driver_volume_type'])

    def test_the_sources_own_attachment_does_not_count(self):
        # (A live migration from node-a, the usual case, still moves.)
        self.c.attach(self.a)
        info = self.c.attach(self.b)[1]
        self.assertEqual('local', info['driver_volume_type'])
        self.assertEqual(move.CLONED, self.c.transfer().state)

    def test_an_alias_of_the_source_does_not_count(self):
        self.elsewhere(host='node-a.example.org')
        self.a.source.node_names = frozenset(
            self.a.source.node_names | {'node-a.example.org'})
        info = self.c.attach(self.b)[1]
        self.assertEqual('local', info['driver_volume_type'])
        self.assertEqual(move.CLONED, self.c.transfer().state)

    NODE_C = {'host': 'node-c', 'ip': '10.0.0.3',
              'initiator': 'iqn.1993-08.org.debian:01:node-c'}

    def acl(self):
        return set(self.a.target.exports.get(IQN, {}).get('acl', ()))

    def older_aborted_move_keeping_its_export(self):
        """An 'aborted' move of an older release, its export still there.

        (Its give-up could not remove the export; that release did not
        record the ACL it gave: no dmclone_move_export.)
        """
        self.saved(state=move.ABORTED)
        update = self.a.target.create_export(self.c.ctxt, self.volume(),
                                             HANDLE_PATH)
        self.c.db.volume_update(self.c.ctxt, VOLUME_ID,
                                {'provider_location': update['location'],
                                 'provider_auth': update['auth']})
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.assertEqual({self.b.props['initiator']}, self.acl())

    def iscsi_attachment(self, connector, status=ATTACHED):
        """An iSCSI attachment (a backup host's) as Cinder records it."""
        att = {'id': fake.ATTACHMENT2_ID, 'instance_uuid': None,
               'attach_status': status, 'attached_host': None,
               'connector': None}
        if connector is not None:
            self.a.target.initialize_connection(self.volume(), connector)
            att.update(attached_host=connector['host'],
                       connector=dict(connector))
        self.c.attachments.append(att)

    def node_b_attached_elsewhere(self):
        """node-b's instance has another volume attached: its connector."""
        self.c.other_attachments.append({
            'id': fake.ATTACHMENT2_ID, 'volume_id': fake.VOLUME2_ID,
            'instance_uuid': fake.INSTANCE_ID,
            'attach_status': ATTACHED, 'attached_host': self.b.name,
            'connector': dict(self.b.props)})

    def legacy_iscsi_connection(self, connector):
        """An iSCSI connection with no attachment record (cinder-backup's).

        Cinder's manager.initialize_connection: create_export, then
        initialize_connection; nothing is recorded.
        """
        self.a.create_export(self.c.ctxt, self.volume(), dict(connector))
        info = self.a.initialize_connection(self.volume(), dict(connector))
        self.assertEqual('iscsi', info['driver_volume_type'])

    def test_ending_an_older_releases_aborted_move_drops_its_export(self):
        # Review 8, R8-6: the release that recorded the move recorded
        # not which ACL its export gave; node-b's initiator is known from
        # node-b's attachments (review 9): its ACL goes, and the target.
        self.older_aborted_move_keeping_its_export()
        self.node_b_attached_elsewhere()
        self.c.restart(self.a)
        self.assertIsNone(self.c.transfer())
        self.assertNotIn(IQN, self.a.target.exports)
        self.assertIsNone(self.c.db.volumes[VOLUME_ID]['provider_location'])

    def test_ending_an_older_releases_aborted_move_keeps_attachments(self):
        # node-c's iSCSI attachment uses the same target: its ACL stays.
        self.older_aborted_move_keeping_its_export()
        self.node_b_attached_elsewhere()
        self.iscsi_attachment(self.NODE_C)
        self.c.restart(self.a)
        self.assertEqual({self.NODE_C['initiator']}, self.acl())
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])

    def test_ending_an_older_releases_aborted_move_keeps_a_backups_acl(
            self):
        # Review 9: cinder-backup (on node-c) connects to the volume with
        # Cinder's initialize_connection, which records no attachment.
        # Before, ending the older release's aborted move removed every
        # ACL no attachment names: the backup's too, whose reads failed.
        self.older_aborted_move_keeping_its_export()
        self.node_b_attached_elsewhere()
        self.legacy_iscsi_connection(self.NODE_C)
        self.assertEqual({self.b.props['initiator'], self.NODE_C['initiator']},
                         self.acl())
        self.c.restart(self.a)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({self.NODE_C['initiator']}, self.acl())
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])

    def test_ending_an_older_releases_aborted_move_with_node_b_unknown(self):
        # No attachment tells node-b's initiator: no ACL can be proved
        # the move's, so none goes (the backup's stays); the operator is
        # told which target and node to check.
        self.older_aborted_move_keeping_its_export()
        self.legacy_iscsi_connection(self.NODE_C)
        self.c.restart(self.a)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({self.b.props['initiator'], self.NODE_C['initiator']},
                         self.acl())
        self.assertIn(self.b.name, str(self.log.warning.call_args_list))

    def test_ending_an_older_releases_aborted_move_during_an_attach(self):
        # An attachment reserved, its connector not saved yet: which
        # ACL is its is unknown, so none goes.
        self.older_aborted_move_keeping_its_export()
        self.iscsi_attachment(None, status=RESERVED)
        self.c.restart(self.a)
        self.assertEqual({self.b.props['initiator']}, self.acl())

    def test_abandon_of_an_aborted_move_keeps_a_later_iscsi_attach(self):
        # Review 7, R7-3.  node-b died mid-move: node-a gave the move up
        # (its export for node-b dropped) and recorded it 'aborted',
        # which nothing treats as moving.  node-c (no service of this
        # backend: a backup host) then attaches the volume over iSCSI.
        # node-a's service restarts while node-b is still dead: its
        # recovery ABANDONed the 'aborted' move and dropped "the export
        # made for it" with ANY_INITIATOR, which was node-c's live
        # export: node-c's I/O failed, and the record forgot the export,
        # so Cinder's start did not restore it either.
        node_c = {'host': 'node-c', 'ip': '10.0.0.3',
                  'initiator': 'iqn.1993-08.org.debian:01:node-c'}

        def acl():
            return set(self.a.target.exports.get(IQN, {}).get('acl', ()))
        self.b.down = True
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertNotIn(IQN, self.a.target.exports)
        info = self.a.attach(self.c.volume(), dict(node_c))
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertEqual({node_c['initiator']}, acl())
        self.c.restart(self.a)
        self.assertEqual({node_c['initiator']}, acl())
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])


class OnStatusTestCase(ClusterTestCase):

    def test_publishes_progress(self):
        self.moved()
        self.b.dm.hydrate(HANDLE, 4096)
        self.b.monitor.tick()
        md = self.c.db.admin_metadata[VOLUME_ID]
        self.assertEqual('25.0', md['dmclone_percent'])
        self.assertEqual('4096', md['dmclone_hydrated_regions'])
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.log.info.assert_called()

    def test_rollback_during_a_tick_leaves_no_progress_behind(self):
        # The monitor read the move (cloned), then waited for the lock a
        # rollback held (Nova removed the destination's attachment): the
        # volume is back on the source, and no progress of a move that
        # no longer exists may be written after the rollback cleared it
        # (the testbed's fullstack rollback test found its keys there).
        src, dst = self.moved(live=True)
        original = self.b.destination.commit_pending

        def rollback_first(volume_id):
            self.c.detach(dst)
            return original(volume_id)
        self.mock_object(self.b.destination, 'commit_pending',
                         side_effect=rollback_first)
        self.b.monitor.tick()
        self.c.assert_rolled_back()
        self.assertEqual({}, self.c.transfer_keys())

    def test_finished_move_during_a_tick_leaves_no_progress_behind(self):
        self.moved()
        self.b.dm.hydrate(HANDLE)
        original = self.b.destination.load_any

        def finalized_after_the_read(volume_id):
            # Another tick (or a retried finalization) finished the move
            # after this tick read it.
            t = original(volume_id)
            self.mock_object(self.b.destination, 'load_any',
                             side_effect=original)
            self.b.destination.finalize(VOLUME_ID)
            return t
        self.mock_object(self.b.destination, 'load_any',
                         side_effect=finalized_after_the_read)
        self.b.monitor.tick()
        self.c.assert_completed()
        self.assertEqual({}, self.c.transfer_keys())

    def test_a_busy_lock_never_holds_up_the_tick(self):
        # Another step holds the volume's lock (a delete waiting for a
        # source that is down, up to the transfer timeout): the monitor
        # skips this volume's write for this tick instead of waiting,
        # so every other clone's progress, stall report and finalization
        # goes on.  (Found by the review of be76ccc.)
        self.moved()
        self.b.dm.hydrate(HANDLE, 4096)
        self.b.tracker.stall_timeout = 1
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.b.monitor.tick()
        self.assertEqual([], self.c.violations)
        self.assertNotIn('dmclone_percent', self.c.transfer_keys())
        self.assertIn(VOLUME_ID, self.b.tracker.progress)
        self.c.busy.clear()
        self.b.monitor.tick()
        self.assertEqual('25.0', self.c.transfer_keys()['dmclone_percent'])

    def test_a_busy_lock_delays_a_pending_commit(self):
        src, dst = self.moved(live=True)
        self.a.down = True
        self.c.detach(src)
        self.a.down = False
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.b.monitor.tick()
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.busy.clear()
        self.c.now += 60        # (past node-a's rest after its timeout)
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_stall_reported_while_the_lock_service_is_down(self):
        # etcd down: the lock cannot be taken, the progress is not
        # written, but a dead path to the source is still reported.
        self.moved()
        self.b.tracker.stall_timeout = 300
        self.c.lock_error = tooz_coordination.ToozConnectionError(
            'etcd down')
        status = mock.Mock(failed=False, fully_hydrated=False, features=())
        self.b.tracker.on_status(LV, status, hydration.Progress(
            1, 2, 65536, rate=0.0, stalled_seconds=400))
        self.assertIn(VOLUME_ID, self.b.tracker.stalled)
        self.log.error.assert_called_once()

    def test_a_busy_lock_delays_a_finalization(self):
        # (Review of 00cd6f2: finalize took the lock blocking, from the
        # tick and from finalize_pending.)
        self.moved()
        self.b.dm.hydrate(HANDLE)
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.b.monitor.tick()
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.c.busy.clear()
        self.c.settle()
        self.c.assert_completed()

    def test_a_dead_source_costs_one_timeout_per_rest(self):
        # Each call to a dead peer waits for the RPC timeout while the
        # tick, serving every clone of the node, waits with it: after a
        # timeout the monitor leaves that node alone for a while.
        self.moved()
        self.a.down = True
        self.c.tick(self.b)
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        before = len(self.c.rpc.calls)
        self.b.monitor.tick()
        self.assertEqual([], self.c.rpc.calls[before:])
        self.a.down = False
        self.c.settle()
        self.c.assert_completed()

    def test_a_step_that_always_times_out_does_not_starve_the_others(self):
        # Review R4 of 2026-11-25: two moves from node-a wait for it (a
        # retire, a commit's closed step); node-a answers, but one
        # volume's step always times out.  After each rest the monitor
        # tried that volume first (same order every tick), so it rested
        # again and the other never got its turn.  Now the step that timed
        # out last lets the others go first, once.
        dest = self.b.destination
        stuck, other = 'a' * 8, 'b' * 8
        sent = []

        def send(ctxt, volume, t, host, op):
            if t.volume_id == stuck:
                raise oslo_messaging.MessagingTimeout('no answer')
            sent.append(t.volume_id)
        self.mock_object(dest, 'send', side_effect=send)
        moves = [mock.Mock(volume_id=v, source_node='node-a',
                           source_host=self.a.host) for v in (stuck, other)]
        for _ in range(6):          # ticks, 30 s apart: three rests
            self.c.now += 30
            for t in moves:         # (the tick's order: always the same)
                if not dest.source_resting(t):
                    try:
                        dest._send_to_source(self.c.ctxt, None, t,
                                             peer.RETIRE)
                    except oslo_messaging.MessagingTimeout:
                        pass
            if sent:
                break
        self.assertEqual([other], sent)
        self.assertEqual(({}, {}), (dest.resting, dest.yielding))

    def test_the_step_that_timed_out_goes_again_if_alone(self):
        dest = self.b.destination
        t = mock.Mock(volume_id=VOLUME_ID, source_node='node-a',
                      source_host=self.a.host)
        self.mock_object(dest, 'send', side_effect=[
            oslo_messaging.MessagingTimeout('no answer'), None])
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          dest._send_to_source, self.c.ctxt, None, t,
                          peer.RETIRE)
        self.assertTrue(dest.source_resting(t))
        self.c.now += dest.PEER_REST + 1
        # (No other move waited for node-a: no turn to give away.)
        self.assertFalse(dest.source_resting(t))
        dest._send_to_source(self.c.ctxt, None, t, peer.RETIRE)
        self.assertEqual(({}, {}), (dest.resting, dest.yielding))

    def test_a_resting_source_does_not_delay_the_swap(self):
        # Another call to node-a timed out: the retire waits, but the
        # swap to linear, which needs no source, is done at once.
        self.moved()
        self.b.dm.hydrate(HANDLE)
        self.b.destination.resting['node-a'] = self.c.now + 1000
        self.b.monitor.tick()
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        self.assertEqual('linear', self.b.dm.devices[HANDLE][0].target)
        self.assertNotIn('retire', self.ops())
        self.c.now += 1000
        self.c.settle()
        self.c.assert_completed()

    def test_volume_deleted_while_its_finalization_waits(self):
        # The lock's holder was a delete: the volume row is gone when the
        # finalization runs.  No traceback at every tick, no retry.
        self.moved()
        self.b.dm.hydrate(HANDLE)
        self.mock_object(self.b.destination, 'load', side_effect=(
            exception.VolumeNotFound(volume_id=VOLUME_ID)))
        self.b.destination.finalize(VOLUME_ID)
        self.b.destination.finalize_pending()
        self.assertEqual(set(), self.b.destination.pending_finalize)
        self.log.exception.assert_not_called()

    def test_volume_deleted_during_a_tick_is_skipped(self):
        self.moved()
        self.b.dm.hydrate(HANDLE, 4096)
        self.mock_object(self.b.destination, 'load', side_effect=(
            exception.VolumeNotFound(volume_id=VOLUME_ID)))
        self.b.monitor.tick()
        self.assertNotIn('dmclone_percent', self.c.transfer_keys())
        self.log.exception.assert_not_called()

    def test_progress_report_for_the_pool_stats(self):
        self.assertEqual({}, self.b.tracker.progress_report())
        self.moved()
        self.b.dm.hydrate(HANDLE, 4096)
        self.b.monitor.tick()
        report = self.b.tracker.progress_report()
        self.assertEqual({VOLUME_ID}, set(report))
        self.assertEqual('25.0', report[VOLUME_ID]['percent'])
        self.assertEqual(move.HYDRATING, report[VOLUME_ID]['state'])
        self.assertEqual('node-a', report[VOLUME_ID]['source'])
        # The source has no transfer into it to report.
        self.assertEqual({}, self.a.tracker.progress_report())
        # Finished transfers leave the report.
        self.c.tick(self.b)
        self.c.assert_completed()
        self.assertEqual({}, self.b.tracker.progress_report())
        self.assertEqual({}, self.b.tracker.progress)

    def test_progress_report_forgets_deleted_volumes(self):
        self.moved()
        self.b.dm.hydrate(HANDLE, 4096)
        self.b.monitor.tick()
        self.mock_object(self.b.destination, 'load', side_effect=(
            exception.VolumeNotFound(volume_id=VOLUME_ID)))
        self.assertEqual({}, self.b.tracker.progress_report())
        self.assertEqual({}, self.b.tracker.progress)

    def test_finalizes_when_fully_hydrated(self):
        self.moved()
        self.c.tick(self.b)
        self.c.assert_completed()
        self.assertEqual(['prepare', 'retire'], self.ops())

    def test_cloned_is_never_finalized(self):
        self.moved(live=True)
        self.b.dm.meta_hydrated[META_PATH] = 16384
        self.b.monitor.tick()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual('100.0',
                         self.c.db.admin_metadata[VOLUME_ID]
                         ['dmclone_percent'])
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)

    def test_foreign_clone(self):
        self.c.db.volumes[fake.VOLUME2_ID] = {}
        status = mock.Mock(failed=False)
        self.b.tracker.on_status('volume-%s' % fake.VOLUME2_ID, status, None)
        self.b.tracker.on_status('legacy', status, None)
        self.assertEqual(2, self.log.warning.call_count)
        self.assertEqual({}, self.c.db.admin_metadata)

    def test_clone_of_a_transfer_elsewhere(self):
        self.saved(dest='node-c')
        self.b.tracker.on_status(LV, mock.Mock(failed=False), None)
        self.log.warning.assert_called_once()
        self.assertNotIn('dmclone_percent',
                         self.c.db.admin_metadata[VOLUME_ID])

    def test_failed_clone(self):
        self.moved()
        self.b.dm.failed.add(HANDLE)
        self.b.monitor.tick()
        self.log.error.assert_called_once()
        self.assertNotIn('dmclone_percent',
                         self.c.db.admin_metadata[VOLUME_ID])
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def _report(self, stalled):
        status = mock.Mock(failed=False, fully_hydrated=False, features=())
        self.b.tracker.on_status(LV, status, hydration.Progress(
            1, 2, 65536, rate=0.0, stalled_seconds=stalled))
        return self.b.tracker.progress_report()[VOLUME_ID]

    def test_stall_is_reported_once_then_its_end(self):
        self.moved()
        self.b.tracker.stall_timeout = 300
        self.assertFalse(self._report(290)['stalled'])
        self.log.error.assert_not_called()
        self.assertTrue(self._report(300)['stalled'])
        self.assertTrue(self._report(310)['stalled'])
        self.log.error.assert_called_once()
        message = self.log.error.call_args.args[0] % \
            self.log.error.call_args.args[1]
        self.assertIn('no progress for 300 s', message)
        self.assertIn('node-a', message)
        self.assertIn(self.c.transfer().target_iqn, message)
        self.assertEqual('310', self.c.db.admin_metadata[VOLUME_ID]
                         ['dmclone_stalled_seconds'])
        self.assertFalse(self._report(0)['stalled'])
        self.assertTrue(any('advances again' in c.args[0]
                            for c in self.log.info.call_args_list))
        self.log.error.assert_called_once()

    def test_stall_of_an_ended_move_is_forgotten(self):
        self.moved()
        self.b.tracker.stall_timeout = 300
        self._report(300)
        self.mock_object(self.b.destination, 'load', return_value=None)
        self.assertEqual({}, self.b.tracker.progress_report())
        self.assertEqual(set(), self.b.tracker.stalled)

    def test_stall_report_can_be_turned_off(self):
        self.moved()
        self.b.tracker.stall_timeout = 0
        self.assertFalse(self._report(10 ** 6)['stalled'])
        self.log.error.assert_not_called()

    def test_eta_in_log(self):
        self.moved()
        progress = hydration.Progress(1, 2, 65536, rate=1.0, eta=12.0)
        status = mock.Mock(failed=False, fully_hydrated=False, features=())
        self.b.tracker.on_status(LV, status, progress)
        self.assertEqual(', 12 s to go',
                         self.log.info.call_args.args[1]['eta'])


@ddt.ddt
class FinalizeTestCase(ClusterTestCase):

    def setUp(self):
        super().setUp()
        self.moved()
        self.b.dm.hydrate(HANDLE)

    def test_order(self):
        steps = []

        def record(obj, name, label=None):
            original = getattr(obj, name)

            def wrapper(*args, **kwargs):
                steps.append(label(*args) if label else name)
                return original(*args, **kwargs)
            self.mock_object(obj, name, side_effect=wrapper)
        record(self.b.store, 'transition',
               lambda ctxt, t, expected, s: 'state ' + s)
        for name in ('swap_to_linear', 'remove_metadata',
                     'disconnect_source'):
            record(self.b.dest, name)
        record(self.b.peer, 'request', lambda *args, **kwargs: args[-2])
        record(self.c.db, 'volume_update', lambda ctxt, vid, values:
               'provider ' + ','.join(sorted(values)))
        record(self.b.store, 'clear')
        self.b.destination.finalize(VOLUME_ID)
        self.assertEqual(['state finalizing', 'swap_to_linear',
                          'remove_metadata', 'disconnect_source', 'retire',
                          'provider provider_auth,provider_location',
                          'clear'], steps)
        self.c.assert_completed()

    @ddt.data(('dest', 'swap_to_linear'), ('dest', 'remove_metadata'),
              ('dest', 'disconnect_source'), ('peer', 'request'),
              ('db', 'volume_update'), ('store', 'clear'),
              ('store', 'transition'))
    @ddt.unpack
    def test_failing_step_is_retried(self, owner, name):
        obj = {'dest': self.b.dest, 'peer': self.b.peer, 'db': self.c.db,
               'store': self.b.store}[owner]
        original = getattr(obj, name)
        failures = [exception.VolumeBackendAPIException(data='boom')]

        def fail_once(*args, **kwargs):
            if failures:
                raise failures.pop()
            return original(*args, **kwargs)
        self.mock_object(obj, name, side_effect=fail_once)
        self.b.destination.finalize(VOLUME_ID)
        self.assertEqual({VOLUME_ID}, self.b.destination.pending_finalize)
        self.assertIsNotNone(self.c.transfer())
        self.log.exception.assert_called_once()
        self.b.destination.finalize_pending()
        self.c.assert_completed()

    def test_source_down_keeps_it_pending(self):
        self.a.down = True
        self.c.tick(self.b)
        self.assertEqual({VOLUME_ID}, self.b.destination.pending_finalize)
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        # Swapped already: the monitor sees no clone any more, the
        # after-tick retry finishes the job.
        self.assertEqual('linear', self.b.dm.devices[HANDLE][0].target)
        self.c.tick(self.b)
        self.assertEqual({VOLUME_ID}, self.b.destination.pending_finalize)
        self.a.down = False
        self.c.tick(self.b)
        self.c.assert_completed()

    def test_nothing_to_finalize(self):
        self.a.store.clear(self.c.ctxt, VOLUME_ID)
        self.b.destination.pending_finalize.add(VOLUME_ID)
        self.b.destination.finalize(VOLUME_ID)
        self.assertEqual(set(), self.b.destination.pending_finalize)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)

    def test_finalize_pending_in_order(self):
        self.b.destination.pending_finalize.update({'b', 'a'})
        finalize = self.mock_object(self.b.destination, 'finalize')
        self.b.destination.finalize_pending()
        self.assertEqual([mock.call('a'), mock.call('b')],
                         finalize.call_args_list)


class ServeTestCase(ClusterTestCase):

    def serve(self, node, op, volume=None, secret=None):
        t = self.c.transfer()
        if secret is None and t is not None:
            secret = t.secret
        connector = dict(self.b.props, dmclone={'op': op, 'secret': secret})
        node.endpoint.receive(volume or self.volume(), connector,
                              peer.payload(connector))

    def test_steps_without_the_secret_are_refused(self):
        # What a volume owner can send through os-terminate_connection.
        self.saved()
        self.b.destination.prepare(self.volume(), {
            'op': 'prepare', 'secret': self.c.transfer().secret})
        for node, op in ((self.b, peer.ABORT), (self.a, peer.RELEASE),
                         (self.a, peer.RETIRE)):
            for secret in ('0' * 32, '', 'x'):
                self.assertRaises(dmc_exception.StepRefused, self.serve,
                                  node, op, secret=secret)
            connector = dict(self.b.props, dmclone={'op': op})
            self.assertRaises(dmc_exception.StepRefused, node.endpoint.receive,
                              self.volume(), connector,
                              peer.payload(connector))
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertIn(IQN, self.a.target.exports)
        self.assertIn(LV, self.a.vg.lvs)

    def test_owner_cannot_abort_a_hydrating_move(self):
        # The reproduction of the review: while the volume hydrated on
        # node-b, os-terminate_connection with this connector made node-b
        # delete the clone and the LV holding the owner's writes.
        self.moved()
        self.b.dm.hydrate(HANDLE, 100)
        for step in ({'op': 'abort'}, {'op': 'retire'}, {'op': 'release'},
                     {'op': 'abort', 'secret': None}, {'op': 'x'}, 'abort'):
            connector = {'host': 'node-x', 'dmclone': step}
            for node in (self.b, self.a):
                self.assertRaises(exception.VolumeBackendAPIException,
                                  self.c.call, node,
                                  node.terminate_connection, self.volume(),
                                  connector)
                self.assertRaises(exception.VolumeBackendAPIException,
                                  self.c.call, node,
                                  node.initialize_connection, self.volume(),
                                  connector)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(IQN, self.a.target.exports)
        self.c.settle()
        self.c.assert_completed()

    def test_an_abort_waits_for_a_build_in_progress(self):
        # The source gave up waiting and asks node-b to abort while node-b
        # still builds: the abort must remove what the build made, not
        # run before the build's last steps.
        self.saved()
        secret = self.c.transfer().secret
        building, release = threading.Event(), threading.Event()
        build = self.b.dest.build_clone

        def slow_build(*args, **kwargs):
            building.set()
            release.wait(10)
            return build(*args, **kwargs)
        self.mock_object(self.b.dest, 'build_clone', side_effect=slow_build)
        worker = threading.Thread(target=self.b.destination.prepare, args=(
            self.volume(), {'op': 'prepare', 'secret': secret}))
        worker.start()
        self.assertTrue(building.wait(10))
        aborter = threading.Thread(target=self.serve,
                                   args=(self.b, peer.ABORT))
        aborter.start()
        aborter.join(0.2)
        self.assertTrue(aborter.is_alive(), 'the abort did not wait')
        release.set()
        worker.join(10)
        aborter.join(10)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)

    def test_source_steps_are_refused_on_the_destination(self):
        self.saved()
        for op in (peer.RELEASE, peer.RETIRE):
            exc = self.assertRaises(dmc_exception.StepRefused, self.serve,
                                    self.b, op)
            self.assertIn('not the source', str(exc))

    def test_steps_of_a_legacy_record_are_refused(self):
        # A record written by 1.1.0 has no secret: nothing can prove a
        # step on it came from the other node.
        self.saved()
        md = self.c.db.admin_metadata[VOLUME_ID]
        md.pop('dmclone_secret')
        self.assertRaises(dmc_exception.StepRefused, self.serve, self.a,
                          peer.RELEASE, secret='')
        self.assertIn(IQN, self.a.target.exports)

    def test_release(self):
        self.saved()
        self.serve(self.a, peer.RELEASE)
        self.assertEqual([('terminate_connection', VOLUME_ID,
                           self.b.props['initiator']),
                          ('remove_export', VOLUME_ID)],
                         self.a.target.calls[-2:])
        self.assertEqual({}, self.a.target.exports)
        self.assertIn(LV, self.a.vg.lvs)

    def test_release_forgets_the_export_it_dropped(self):
        self.saved()
        location = '10.0.0.1:3260,1 %s 0' % IQN
        self.c.db.volume_update(self.c.ctxt, VOLUME_ID, {
            'provider_location': location, 'provider_auth': 'CHAP u s'})
        self.serve(self.a, peer.RELEASE)
        self.assertEqual({}, self.a.target.exports)
        self.assertIsNone(self.c.db.volumes[VOLUME_ID]['provider_location'])
        self.assertIsNone(self.c.db.volumes[VOLUME_ID]['provider_auth'])
        # A release sent again (a destination that died after sending it
        # rolls back again at its restart) finds nothing to do.
        self.serve(self.a, peer.RELEASE)
        self.log.exception.assert_not_called()

    def test_release_failure_is_logged(self):
        self.saved()
        location = '10.0.0.1:3260,1 %s 0' % IQN
        self.c.db.volume_update(self.c.ctxt, VOLUME_ID,
                                {'provider_location': location})
        self.mock_object(self.a.target, 'remove_export',
                         side_effect=ValueError('x'))
        self.serve(self.a, peer.RELEASE)
        self.log.exception.assert_called_once()
        # The export may still be there: the record keeps naming it, so
        # that the next detach on node-a removes it.
        self.assertEqual(location,
                         self.c.db.volumes[VOLUME_ID]['provider_location'])

    def test_retire_refuses_while_the_record_names_this_node(self):
        self.saved()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.serve, self.a, peer.RETIRE)
        self.assertIn('its record still names this node', str(exc))
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(HANDLE, self.a.dm.devices)
        self.assertIn(IQN, self.a.target.exports)

    def test_retire(self):
        self.saved()
        self.a.store.move_volume(self.c.ctxt, VOLUME_ID, self.b.host)
        self.serve(self.a, peer.RETIRE)
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual({}, self.a.dm.devices)
        self.assertEqual({}, self.a.target.exports)
        # Again: nothing left to do, no error.
        self.serve(self.a, peer.RETIRE)

    def test_abort(self):
        self.saved()
        self.b.destination.prepare(self.volume(), {
            'op': 'prepare', 'secret': self.c.transfer().secret})
        self.serve(self.b, peer.ABORT)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)

    def test_abort_not_for_us(self):
        self.saved(dest='node-c')
        self.b.vg.add(LV, '1g')
        self.assertRaises(dmc_exception.StepRefused, self.serve, self.b,
                          peer.ABORT)
        self.assertRaises(dmc_exception.StepRefused, self.serve, self.a,
                          peer.ABORT)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)

    def test_abort_without_transfer(self):
        self.assertRaises(dmc_exception.StepRefused, self.serve, self.b,
                          peer.ABORT, secret='0' * 32)
        self.assertEqual([], self.b.vg.calls)

    def test_other_ops_do_nothing(self):
        self.saved()
        self.assertRaises(dmc_exception.StepRefused, self.a.endpoint.receive,
                          self.volume(), {}, {
                              'op': peer.PREPARE,
                              'secret': self.c.transfer().secret})
        self.assertEqual(2, len(self.a.target.calls))


class RecoverTestCase(ClusterTestCase):

    def restart(self, node, reboot=False):
        if reboot:
            node.reboot()
        else:
            node.restart()
        node.recover()

    def test_preparing_is_torn_down(self):
        self.saved()
        self.b.dest.create_volumes(self.c.transfer(), 1)
        self.restart(self.b)
        self.assertEqual({}, self.b.vg.lvs)
        # The source owns a move being prepared (it holds the lock while
        # it waits): it gives up and clears it, never node-b's recovery.
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.log.warning.assert_called()
        self.restart(self.a)
        self.assertIsNone(self.c.transfer())

    def test_preparing_of_a_volume_recorded_here_keeps_state(self):
        # The source names the destination only after it committed the
        # move: 'preparing' with a record naming node-b is a record
        # rewound by a stale whole-dict save (R14-4), and node-b's LVs
        # are the volume with every write since the commit: kept.
        # Rolled forward: cloned, the clone built again with hydration
        # off (without it nothing tells whether it hydrated), so that it
        # commits on node-a's word (test_rewound_move).
        self.saved()
        self.b.dest.create_volumes(self.c.transfer(), 1)
        lvs = set(self.b.vg.lvs)
        self.a.store.move_volume(self.c.ctxt, VOLUME_ID, self.b.host)
        self.restart(self.b)
        self.assertEqual(lvs, set(self.b.vg.lvs))
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertIn('no_hydration', self.features())
        self.assertEqual([], self.c.violations)

    def test_cloned_is_rebuilt_without_hydration(self):
        self.moved(live=True)
        self.restart(self.b, reboot=True)
        self.assertIn('no_hydration', self.features())
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual([], self.c.violations)

    def test_hydrating_is_rebuilt_with_hydration(self):
        self.moved()
        self.b.dm.hydrate(HANDLE, 1000)
        self.restart(self.b, reboot=True)
        self.assertNotIn('no_hydration', self.features())
        # The hydrated regions are in the (kept) metadata LV.
        self.assertEqual(1000, self.b.dm.status(HANDLE)[0].clone
                         .hydrated_regions)
        self.assertEqual(1, self.b.vg.lvs[META]['zeroed'])
        self.c.settle()
        self.c.assert_completed()

    def test_live_clone_is_left_alone_after_a_service_restart(self):
        self.moved()
        table = self.b.dm.devices[HANDLE]
        self.restart(self.b)
        self.assertIs(table, self.b.dm.devices[HANDLE])
        self.assertEqual(1, [c[0] for c in self.b.dm.calls].count('create'))

    def test_finalizing_is_pending(self):
        self.moved()
        self.c.set_state(self.c.transfer(), move.FINALIZING)
        self.restart(self.b)
        self.assertEqual({VOLUME_ID}, self.b.destination.pending_finalize)
        self.assertEqual(1, [c[0] for c in self.b.dm.calls].count('create'))
        self.c.tick(self.b)
        self.c.assert_completed()

    def test_finalizing_after_a_reboot_rebuilds_the_clone(self):
        self.moved()
        self.b.dm.hydrate(HANDLE)
        self.c.set_state(self.c.transfer(), move.FINALIZING)
        self.restart(self.b, reboot=True)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.assertEqual({VOLUME_ID}, self.b.destination.pending_finalize)
        self.b.destination.finalize_pending()
        self.c.assert_completed()

    def test_source_side_unfinished_move_is_aborted(self):
        self.saved()
        self.b.destination.prepare(self.volume(), {
            'op': 'prepare', 'secret': self.c.transfer().secret})
        self.restart(self.a)
        self.assertEqual(['abort'], self.ops())
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.a.target.exports)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertIn(LV, self.a.vg.lvs)

    def test_an_abandon_lets_the_destination_log_out_first(self):
        exported = self.exported_at_logout()
        self.saved()
        self.b.destination.prepare(self.volume(), {
            'op': 'prepare', 'secret': self.c.transfer().secret})
        self.restart(self.a)
        self.assertEqual([True], exported)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.a.target.exports)

    def test_abort_failure_still_cleans_the_source(self):
        self.saved()
        self.b.down = True
        self.restart(self.a)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertEqual({}, self.a.target.exports)
        self.log.exception.assert_called()
        # The next restart of node-a, with node-b back, ends it.
        self.b.down = False
        self.restart(self.a)
        self.assertIsNone(self.c.transfer())

    def aborted_after_prepare(self):
        """node-b built the clone; node-a then recorded the move aborted."""
        self.saved()
        t = self.c.transfer()
        self.b.destination.prepare(self.volume(), {'op': 'prepare',
                                                   'secret': t.secret})
        self.c.set_state(t, move.ABORTED)

    def assert_nothing_on_b(self):
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)

    def test_aborted_transfer_is_dropped_by_the_destination(self):
        self.aborted_after_prepare()
        self.restart(self.b)
        self.assert_nothing_on_b()

    def test_aborted_move_of_a_name_id_volume_is_found_after_a_reboot(self):
        # The volume's LV is not named after it (a _name_id after a
        # generic migration), and its record still names node-a: only its
        # move record says node-b has leftovers.  (Before: recovery took
        # the metadata LV's name for the volume's id, found nothing, and
        # the clone, its LVs and session stayed behind unreported but for
        # an "orphan" warning.)
        self.aborted_after_prepare()
        db = self.c.db
        other = self.name_id_volume()
        self.restart(self.b, reboot=True)
        self.assertNotIn('dmclone_state', db.admin_metadata[other])
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)

    def test_aborted_clone_seen_by_the_monitor_is_dropped(self):
        # node-b answered after node-a gave up: nothing will use it.
        self.aborted_after_prepare()
        self.c.tick(self.b)
        self.assert_nothing_on_b()

    def test_monitor_spares_a_retried_move_that_took_the_lock_first(self):
        # The monitor read 'aborted' outside the lock; a retried move of
        # the same volume took the lock first and recorded itself.  The
        # monitor must not tear that one down.  (Before: it did.)
        self.aborted_after_prepare()
        retried = self.c.transfer()
        retried.secret = ''
        retried.state = move.PREPARING
        locking = move.lock

        def retry_first(volume_id):
            self.a.store.save(self.c.ctxt, retried)
            return locking(volume_id)
        self.mock_object(move, 'lock', side_effect=retry_first)
        self.c.tick(self.b)
        self.assertEqual(retried, self.c.transfer())
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(HANDLE, self.b.dm.devices)

    def test_clone_of_another_lv_of_that_volume_is_not_its_move(self):
        self.moved()
        t = self.c.transfer()
        self.c.db.admin_metadata[VOLUME_ID]['dmclone_lv_name'] = \
            'volume-other'
        self.c.tick(self.b)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertIn(LV, self.b.tracker.orphans)
        self.assertEqual(t.secret, self.c.transfer().secret)

    def test_clone_of_a_deleted_volume_is_reported_once(self):
        # (Before: VolumeNotFound at every monitor tick.)
        self.moved()
        self.mock_object(self.b.destination, 'load_any',
                         side_effect=exception.VolumeNotFound(
                             volume_id=VOLUME_ID))
        for _ in range(3):
            report = self.b.monitor.tick()
            self.assertEqual([], report.failed)
        warnings = [c for c in self.log.warning.call_args_list
                    if 'abandoned move' in c[0][0]]
        self.assertEqual(1, len(warnings))
        self.assertIn(LV, self.b.vg.lvs)

    def test_deleting_a_volume_whose_move_was_aborted(self):
        self.aborted_after_prepare()
        # (What the driver's delete_volume does before it deletes the LV.)
        self.assertFalse(self.a.destination.delete(self.volume()))
        self.a.source.give_up_aborted(self.volume())
        self.assert_nothing_on_b()

    # -- a reboot of the source during a move (issue 18, scenario 4) ----
    def assert_exported_to_b(self):
        export = self.a.target.exports.get(
            fakes.FakeTarget.iqn(self.volume()))
        self.assertIsNotNone(export, 'node-a exports nothing')
        self.assertIn(self.b.props['initiator'], export['acl'])
        self.assertTrue(self.a.dm.exists(HANDLE))
        self.assertEqual(HANDLE_PATH, export['path'])

    def test_source_reboot_during_hydration_restores_its_export(self):
        # LIO's targets and the handle go with the reboot; the record
        # names node-b, so Cinder's start calls no ensure_export for it
        # on node-a.  (Before: nothing re-exported it, and node-b could
        # never read the regions it had not copied.)
        self.moved()
        self.assert_exported_to_b()
        self.restart(self.a, reboot=True)
        self.assert_exported_to_b()
        self.c.settle()
        self.c.assert_completed()

    def test_source_reboot_in_the_live_migration_window(self):
        self.moved(live=True)
        self.restart(self.a, reboot=True)
        self.assert_exported_to_b()
        self.assertEqual(move.CLONED, self.c.transfer().state)

    def test_source_restart_without_reboot_keeps_its_export(self):
        self.moved()
        self.restart(self.a)
        self.assert_exported_to_b()

    def test_no_export_again_after_the_retire(self):
        self.moved()
        self.c.settle()
        self.c.assert_completed()
        self.restart(self.a, reboot=True)
        self.assertEqual({}, self.a.target.exports)

    def test_a_move_abandoned_after_a_reboot_leaves_no_export(self):
        # Review R6 of 2026-11-25: node-a died while node-b built (the
        # move recorded, its export with node-b's ACL saved by LIO) and
        # rebooted.  Its recovery abandons the move, but the kernel had
        # no target to remove (rtstool fails), so LIO's saved
        # configuration kept it, and the start's ensure_export restored
        # it: node-b stayed admitted to a volume living on node-a (and a
        # later move elsewhere would see that ACL and stay put).
        prepare = self.a.peer.prepare
        calls = []

        def crash_once(*args, **kwargs):
            calls.append(args)
            if len(calls) == 1:
                raise fake_cluster.Crash()
            return prepare(*args, **kwargs)
        self.mock_object(self.a.peer, 'prepare', side_effect=crash_once)
        self.c.reboot = True    # (node-a's start: recovery, ensure_export)
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.attach, self.b)
        self.assertIsNone(self.c.transfer())
        iqn = fakes.FakeTarget.iqn(self.volume())
        for config in (self.a.target.exports, self.a.target.saved):
            self.assertNotIn(iqn, config)
        self.assertIsNone(self.c.db.volumes[VOLUME_ID]['provider_location'])
        # And the volume moves to node-b at its next attach.
        self.assertEqual('local',
                         self.c.attach(self.b)[1]['driver_volume_type'])

    def test_an_abandon_whose_restore_fails_still_gives_up(self):
        # (The restore is best effort: the move is given up all the same,
        # and the record keeps naming the export its removal missed.)
        self.mock_object(self.a, '_export_moving_away',
                         side_effect=RuntimeError('rtstool restore failed'))
        self.mock_object(self.a.peer, 'prepare',
                         side_effect=fake_cluster.Crash)
        self.c.reboot = True
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.attach, self.b)
        self.assertIsNone(self.c.transfer())
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])
        self.log.warning.assert_any_call(
            'Could not restore the saved exports before removing the one '
            'of volume %s.', VOLUME_ID, exc_info=True)

    def destination_started_while_source_down(self):
        """Both nodes lost power; node-b's service starts, node-a's not."""
        self.a.reboot()
        self.a.down = True
        self.restart(self.b, reboot=True)

    def both_rebooted_destination_first(self):
        """Both nodes lost power; node-b's service starts before node-a's."""
        self.destination_started_while_source_down()
        self.assertFalse(self.b.dm.exists(HANDLE))
        self.a.down = False
        self.restart(self.a)
        self.assert_exported_to_b()

    def test_both_rebooted_destination_first_rebuilds_later(self):
        # Review R2 of 2026-11-25: node-b's start could not log in to
        # node-a's export (node-a still down): the clone was never built
        # again until an operator restarted node-b's service, and the
        # instance here could not attach its volume.  The monitor now
        # tries again once node-a rests no more.
        self.moved()
        self.b.dm.hydrate(HANDLE, 4096)
        self.both_rebooted_destination_first()
        self.c.tick(self.b)
        self.c.tick(self.b)
        self.assertTrue(self.b.dm.exists(HANDLE))
        self.c.settle()
        self.c.assert_completed()

    def test_both_rebooted_in_the_live_migration_window(self):
        src, dst = self.moved(live=True)
        self.both_rebooted_destination_first()
        self.c.tick(self.b)
        self.c.tick(self.b)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()

    def test_a_rebuild_that_fails_again_waits_for_the_source(self):
        self.moved()
        self.destination_started_while_source_down()
        connects = len(self.b.connector.calls)
        self.c.tick(self.b)         # (node-a rests: no login)
        self.assertEqual(connects, len(self.b.connector.calls))
        self.c.tick(self.b)         # a login, refused again
        self.c.tick(self.b)
        self.assertEqual(connects + 1, len(self.b.connector.calls))
        self.assertFalse(self.b.dm.exists(HANDLE))
        self.assertIn(VOLUME_ID, self.b.moves.recovery.pending_rebuild)

    def test_no_login_while_the_sources_service_is_down(self):
        # (Review of the retry: a login to a dead portal can take minutes,
        # under the volume's lock, at every rest.)  The source's heartbeat
        # says when trying makes sense: its start re-exports first.
        self.moved()
        self.destination_started_while_source_down()
        self.a.service_up = False
        connects = len(self.b.connector.calls)
        for _ in range(6):
            self.c.tick(self.b)
        self.assertEqual(connects, len(self.b.connector.calls))
        self.a.down = False
        self.a.service_up = True
        self.restart(self.a)
        self.c.tick(self.b)
        self.assertTrue(self.b.dm.exists(HANDLE))
        self.c.settle()
        self.c.assert_completed()

    def test_a_pending_rebuild_of_a_later_move_is_dropped(self):
        # The record now describes another move (the volume was rolled
        # back and moved again meanwhile): not the one to rebuild.
        self.moved()
        self.destination_started_while_source_down()
        self.c.db.admin_metadata[VOLUME_ID]['dmclone_secret'] = 'f' * 32
        connects = len(self.b.connector.calls)
        self.c.tick(self.b)
        self.c.tick(self.b)
        self.assertEqual({}, self.b.moves.recovery.pending_rebuild)
        self.assertEqual(connects, len(self.b.connector.calls))

    def test_a_rollback_after_both_nodes_lost_power_is_retried(self):
        # Review of the retry (2026-11-25, evening): Nova's rollback of a
        # live migration deleted node-b's attachment, but the detach never
        # reached node-b (both nodes lost power); node-b starts first.
        # Its rollback needs the clone (were there writes?), whose login
        # to node-a failed: only a REBUILD was retried, so the move stayed
        # cloned on node-b for good and the instance on node-a could not
        # reconnect.
        src, dst = self.moved(live=True)
        self.c.attachments.remove(dst)
        self.both_rebooted_destination_first()
        for _ in range(3):
            self.c.tick(self.b)
        self.c.assert_rolled_back()

    def test_an_unreadable_pending_record_does_not_stop_the_retries(self):
        self.moved()
        self.destination_started_while_source_down()
        recovery_ = self.b.moves.recovery
        t = recovery_.pending_rebuild[VOLUME_ID]
        recovery_.pending_rebuild['0' * 8] = t     # sorts first
        self.mock_object(recovery_, '_still_pending', side_effect=[
            move.MoveStateInvalid(volume_id='0' * 8, reason='half edited'),
            False])
        self.c.tick(self.b)
        self.assertEqual(2, recovery_._still_pending.call_count)

    def test_a_rebuild_without_metadata_is_not_waiting_for_the_source(self):
        # The metadata LV is lost (its disk failed), the source is fine:
        # that rebuild will never work.  It is not retried, and a local
        # attach says the clone is missing, not that the source is away.
        # (The real-kernel test_start_never_maps_a_partial_copy caught
        # the misleading message in CI of a5f0f67.)
        self.moved(live=True)
        self.b.vg.delete(META)
        self.restart(self.b, reboot=True)
        self.assertEqual({}, self.b.moves.recovery.pending_rebuild)
        self.assertFalse(self.b.dm.exists(HANDLE))

    def test_a_pending_rebuild_of_a_deleted_volume_is_dropped(self):
        self.moved()
        self.destination_started_while_source_down()
        del self.c.db.volumes[VOLUME_ID]
        self.c.tick(self.b)
        self.c.tick(self.b)
        self.assertEqual({}, self.b.moves.recovery.pending_rebuild)

    def unmanage(self, node):
        """What the driver's unmanage does before it drops the handle."""
        volume = self.volume()
        node.source.give_up_aborted(volume)
        node.destination.before_unmanage(volume)

    def test_unmanaging_a_volume_whose_move_was_aborted(self):
        # (Before: allowed without asking node-b, whose clone, session
        # and partial LV then belonged to no volume -- found by the
        # review of f35d986.)
        self.aborted_after_prepare()
        self.unmanage(self.a)
        self.assert_nothing_on_b()

    def test_unmanage_refused_while_an_aborted_move_is_not_cleaned(self):
        self.aborted_after_prepare()
        self.b.down = True
        self.assertRaises(move.MoveInProgress, self.unmanage, self.a)
        self.assertEqual(move.ABORTED, self.c.transfer_keys()[
            'dmclone_state'])

    def test_unmanage_refused_while_hydrating(self):
        self.moved()
        exc = self.assertRaises(move.MoveInProgress, self.unmanage, self.b)
        self.assertIn('unmanaging it', str(exc))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_unmanage_ends_a_move_whose_source_is_lost_after_the_swap(self):
        # Hydration finished, then node-a was lost for good: the retire
        # never succeeds and the move stays in finalizing with a complete
        # linear copy on node-b.  Unmanage (then manage) is the API's way
        # out, as it was before unmanage was refused while moving (the
        # review of f35d986 found that refusal left only database edits).
        self.moved()
        self.a.down = True
        self.c.settle()
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        self.assertEqual('linear', self.b.dm.devices[HANDLE][0].target)
        self.unmanage(self.b)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(set(), self.b.destination.pending_finalize)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        self.assertEqual({}, self.b.connector.sessions)
        warning = self.log.warning.call_args.args
        self.assertIn('node-a', warning[0] % warning[1])
        # The monitor no longer retries the retire.
        self.log.exception.reset_mock()
        self.c.tick(self.b)
        self.log.exception.assert_not_called()

    def test_unmanage_retires_the_source_when_it_answers(self):
        # The retire failed once (node-a restarting); the admin unmanages
        # once node-a is back: its copy must be retired, not left behind
        # unwiped, exported to node-b (review of 00cd6f2).
        self.moved()
        self.a.down = True
        self.c.settle()
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        self.a.down = False
        self.unmanage(self.b)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.a.target.exports)
        self.assertEqual({}, self.a.dm.devices)
        self.assertEqual({}, self.a.vg.lvs)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])

    def test_unmanage_refused_when_a_live_source_refuses_the_retire(self):
        # node-a answers but cannot retire right now (its handle held for
        # a moment): forgetting the move would leave its copy unwiped and
        # described by nothing; refuse, a retry works (review of 883a6d8).
        self.moved()
        self.a.down = True
        self.c.settle()
        self.a.down = False
        self.a.dm.openers[HANDLE] = 1
        self.assertRaises(exception.VolumeIsBusy, self.unmanage, self.b)
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        self.a.dm.openers[HANDLE] = 0
        self.unmanage(self.b)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.a.vg.lvs)

    def test_unmanage_refused_in_finalizing_before_the_swap(self):
        # The metadata LV is there until the swap is done: the clone
        # may still read from the source.
        self.moved()
        self.b.dm.hydrate(HANDLE)
        t = self.c.transfer()
        self.c.set_state(t, move.FINALIZING)
        self.assertRaises(move.MoveInProgress, self.unmanage, self.b)

    def test_cloned_without_source_attachment_commits(self):
        # The detach on the source reached node-b, which died before it
        # recorded the commit; the attachment is gone meanwhile.
        self.moved(live=True)
        self.c.attachments[:] = [a for a in self.c.attachments
                                 if a['attached_host'] != 'node-a']
        self.restart(self.b)
        # Not before the source confirms its copy is closed: the next
        # monitor tick asks.
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        self.c.settle()
        self.c.assert_completed()

    def test_restart_never_commits_under_a_live_writer(self):
        # The owner's os-detach of the source's attachment (Cinder's
        # legacy detach: no terminate_connection, so node-b never heard
        # of it) while the instance on node-a still writes; node-b then
        # restarts.  (Failed before: the start committed at once.)
        self.moved(live=True)
        self.c.attachments[:] = [a for a in self.c.attachments
                                 if a['attached_host'] != 'node-a']
        self.a.dm.openers[HANDLE] = 1
        self.a.source.CLOSE_WAIT = 0
        self.restart(self.b)
        self.c.settle()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertFalse(self.b.dm.hydration[HANDLE])
        self.assertIn(LV, self.a.vg.lvs)
        self.assertTrue(self.b.tracker.progress_report()[VOLUME_ID][
            'awaiting_source'])
        # Reported once, and in the record for the status tool.
        self.assertEqual('node-a', self.c.transfer_keys()[
            'dmclone_awaiting_source'])
        self.assertEqual(1, sum('does not confirm' in c.args[0]
                                for c in self.log.warning.call_args_list))
        self.a.dm.openers[HANDLE] = 0
        self.c.settle()
        self.c.assert_completed()

    def test_source_detach_retried_after_the_commit(self):
        src, dst = self.moved(live=True)
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        # The same detach again (the first answer was lost): a no-op.
        volume = self.volume()
        self.assertTrue(self.b.destination.detached(volume, src['connector']))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertFalse(self.b.destination.detached(
            volume, {'host': 'node-c'}))
        self.c.settle()
        self.c.assert_completed()

    def test_cloned_without_destination_attachment_rolls_back(self):
        self.moved(live=True)
        self.c.attachments[:] = [a for a in self.c.attachments
                                 if a['attached_host'] == 'node-a']
        self.restart(self.b)
        self.c.assert_rolled_back()

    def test_source_after_a_finished_move_does_nothing(self):
        self.moved()
        self.restart(self.a)
        # (Not even listed there: the record names node-b.)
        self.a.moves.recovery.recover([self.volume()], [])
        self.assertEqual(['prepare'], self.ops())
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def test_invalid_state_is_skipped(self):
        bad = fake_volume.fake_volume_obj(
            self.c.ctxt, id=fake.VOLUME2_ID, host=self.b.host,
            volume_admin_metadata=[{'key': 'dmclone_state',
                                    'value': 'hydrating'}])
        recover_one = self.mock_object(self.b.moves.recovery, 'run')
        self.saved()
        good = self.volume()
        self.b.moves.recovery.recover([bad, good], [])
        self.log.exception.assert_called_once()
        self.assertIn(fake.VOLUME2_ID, self.log.exception.call_args.args)
        recover_one.assert_called_once_with(good, self.c.transfer())

    def test_one_failure_does_not_stop_the_others(self):
        self.saved()
        recover_one = self.mock_object(self.b.moves.recovery, 'run',
                                       side_effect=[ValueError('x'), None])
        self.b.moves.recovery.recover([self.volume(), self.volume()], [])
        self.assertEqual(2, recover_one.call_count)
        self.log.exception.assert_called_once()

    def test_volume_without_transfer(self):
        recover_one = self.mock_object(self.b.moves.recovery, 'run')
        self.b.moves.recovery.recover([self.volume()], [])
        recover_one.assert_not_called()

    def test_leftover_metadata_is_reported_never_deleted(self):
        stray = 'volume-%s-dmcmeta' % fake.VOLUME2_ID
        self.b.vg.add(stray, '8m')
        self.moved()
        self.b.moves.recovery.recover([self.volume()], [META, stray, 'legacy'])
        warnings = [c.args for c in self.log.warning.call_args_list]
        self.assertEqual(1, len(warnings))
        self.assertIn(stray, warnings[0])
        self.assertIn(stray, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)

    def test_abandoned_attempt_is_cleaned_then_replaced(self):
        # The source gave up before the destination came back: recovery
        # there finds the transfer aborted and removes what it built.
        self.c.restart_before_timeout = False
        self.c.crash_at(self.b.dest, 'build_clone', 'after')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.restart(self.b)
        self.assertNotIn(META, self.b.vg.lvs)
        self.assertIsNone(self.c.transfer())
        # The next move builds afresh and completes.
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()


class ExtendRetuneDeleteTestCase(ClusterTestCase):

    def test_extend(self):
        self.moved()
        self.assertTrue(self.extend_on(self.b))
        self.assertEqual(['clone', 'linear'],
                         [s.target for s in self.b.dm.devices[HANDLE]])
        self.c.settle()
        self.assertEqual([dmsetup.linear_segment(0, 2 * SECTORS, LV_PATH)],
                         self.b.dm.devices[HANDLE])

    def test_no_extend_while_a_live_migration_may_roll_back(self):
        # A rollback would leave the record larger than node-a's LV.
        # (Before: the extend went through, and after the rollback every
        # later move was refused because the LV was smaller than its
        # record.)
        src, dst = self.moved(live=True)
        self.assertRaises(move.MoveInProgress, self.extend_on, self.b)
        self.assertEqual(SECTORS, self.b.dm.device_sectors(LV_PATH))
        self.c.detach(src)
        self.assertTrue(self.extend_on(self.b))
        # (node-a's LV is no longer the volume once the move committed.)
        self.assertRaises(move.MoveInProgress, self.extend_on, self.a)
        self.assertEqual(SECTORS, self.a.dm.device_sectors(LV_PATH))

    def test_no_extend_on_the_source_while_the_move_is_prepared(self):
        # The destination builds a clone of the old size meanwhile.
        self.saved()
        self.assertRaises(move.MoveInProgress, self.extend_on, self.a)
        self.assertEqual(SECTORS, self.a.dm.device_sectors(LV_PATH))

    def test_move_records_the_length_the_lv_has_under_the_lock(self):
        # Review 5: an online extend served after the attach's driver
        # code ran, before Source.move took the lock.  Before: the LV's
        # length was read in between, and the move recorded (and node-b
        # built) a clone of the old length; the tail written on node-a
        # after the extend went with node-a's copy at the retire.
        a = self.a
        self.c.attach(a)                    # the instance runs on node-a
        move_ = a.source.move

        def extend_gets_the_lock_first(volume, connector, read_sectors):
            self.extend_on(a)
            return move_(volume, connector, read_sectors)
        self.mock_object(a.source, 'move',
                         side_effect=extend_gets_the_lock_first)
        self.c.attach(self.b)               # live migration: node-b
        t = self.c.transfer()
        self.assertEqual(2 * SECTORS, a.dm.device_sectors(LV_PATH))
        self.assertEqual(
            a.dm.device_sectors(LV_PATH), t.clone_sectors,
            'move recorded a clone of %d sectors over a source LV of %d'
            % (t.clone_sectors, a.dm.device_sectors(LV_PATH)))

    def test_extend_not_here(self):
        self.moved()
        # (node-a, the source: refused, see above)
        self.assertFalse(self.b.destination.extend(self._other_volume(),
                                                   lambda: None))

    def _other_volume(self):
        # (A volume of node-b's, no move recorded.)
        self.c.db.volumes[fake.VOLUME2_ID] = {
            'host': self.b.host, 'size': 1, 'availability_zone': self.b.az,
            'provider_location': None, 'provider_auth': None}
        return fake_volume.fake_volume_obj(self.c.ctxt, id=fake.VOLUME2_ID)

    def test_extend_while_finalizing(self):
        self.moved()
        self.c.set_state(self.c.transfer(), move.FINALIZING)
        self.assertFalse(self.extend_on(self.b))

    def test_retune(self):
        self.moved(live=True)
        tuning = mock.Mock(return_value=(128, 32))
        self.b.destination.tuning = tuning
        volume_type = {'extra_specs': {}}
        self.b.destination.retune(self.volume(), volume_type)
        tuning.assert_called_once_with(volume_type)
        self.assertEqual([('message', HANDLE, 'hydration_threshold', 128),
                          ('message', HANDLE, 'hydration_batch_size', 32)],
                         [c for c in self.b.dm.calls if c[0] == 'message'])

    def test_retune_nothing_to_tune(self):
        self.moved()
        self.a.destination.retune(self.volume(), None)
        self.c.set_state(self.c.transfer(), move.FINALIZING)
        self.b.destination.retune(self.volume(), None)
        self.assertNotIn('message', [c[0] for c in self.b.dm.calls])
        self.assertNotIn('message', [c[0] for c in self.a.dm.calls])

    def test_delete(self):
        self.moved()
        self.b.destination.pending_finalize.add(VOLUME_ID)
        self.assertTrue(self.b.destination.delete(self.volume()))
        for node in (self.a, self.b):
            self.assertEqual({}, node.vg.lvs)
            self.assertEqual({}, node.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)
        self.assertEqual({}, self.a.target.exports)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(set(), self.b.destination.pending_finalize)
        self.assertEqual('retire', self.ops()[-1])

    def test_delete_that_lost_the_race_for_the_lock(self):
        self.moved()
        t = self.c.transfer()
        self.mock_object(self.b.destination, 'load', side_effect=[t, None])
        self.assertFalse(self.b.destination.delete(self.volume()))
        self.assertIn(LV, self.b.vg.lvs)

    def test_delete_not_here(self):
        # A delete on the source of a move into node-b, whose record names
        # node-b: refused (before: False, and the driver went on to
        # remove the LV node-b's clone still reads from).
        self.moved()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.a.destination.delete, self.volume())
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(LV, self.b.vg.lvs)

    def test_delete_with_source_down_can_be_retried(self):
        self.moved()
        self.a.down = True
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.b.destination.delete, self.volume())
        self.assertIsNotNone(self.c.transfer())
        self.a.down = False
        self.assertTrue(self.b.destination.delete(self.volume()))
        self.assertEqual({}, self.a.vg.lvs)

    def test_refuse_if_moving_under_the_lock(self):
        self.saved()
        taken = []
        locking = move.lock
        self.mock_object(move, 'lock', side_effect=lambda vid: (
            taken.append(vid), locking(vid))[1])
        self.assertRaises(move.MoveInProgress,
                          self.a.source.refuse_if_moving, self.volume(),
                          'attaching', locked=True)
        self.assertEqual([VOLUME_ID], taken)

    def test_local_attach_on_the_source_waits_and_is_refused(self):
        # The move being prepared holds the lock; once it is ours, the
        # move has been recorded (a 'preparing' one left after the lock
        # was free is ended instead: test_control_plane).
        t = self.saved()
        taken = []
        locking = move.lock

        def lock(vid):
            taken.append(vid)
            self.c.set_state(t, move.HYDRATING)
            return locking(vid)
        self.mock_object(move, 'lock', side_effect=lock)
        exc = self.assertRaises(move.MoveInProgress,
                                self.a.source.refuse_local_attach,
                                self.volume(), 'attaching it here')
        self.assertIn('attaching it here is possible once', str(exc))
        self.assertEqual(VOLUME_ID, taken[-1])

    def test_local_attach_on_the_destination_while_it_builds_is_refused(self):
        self.saved()
        self.assertRaises(move.MoveInProgress,
                          self.b.source.refuse_local_attach, self.volume(),
                          'attaching it here')

    def test_stale_volume_object_never_gives_up_a_committed_move(self):
        # A terminate that reaches node-a with a volume object loaded
        # before the move recorded node-b (cinder-api loads it before its
        # RPC) must not take the move for a half-finished rollback and
        # abort it: node-b's clone is the volume.  (Before: node-b's clone
        # and LV were torn down, the record still named node-b.)
        stale = self.c.volume()
        self.moved(live=True)
        self.c.call(self.a, self.a.terminate_connection, stale,
                    {'host': 'node-c', 'initiator': 'iqn.2000-01.x:c'})
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIn(LV, self.b.vg.lvs)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)

    def test_reattach_on_the_destination_during_hydration(self):
        # The clone is the volume there: a detach and a new attach on
        # node-b while it hydrates (or the first attach after a
        # migration) get the handle.  (Before 2026-11-25: refused until
        # hydration finished, a regression of the hardening.)
        att = self.c.attach(self.b)[0]
        self.c.detach(att)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        att, info = self.c.attach(self.b)
        self.assertEqual('local', info['driver_volume_type'])
        self.assertEqual(HANDLE_PATH, info['data']['device_path'])
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.c.settle()
        self.c.assert_completed()

    def test_refuse_if_moving(self):
        self.assertIsNone(self.a.source.refuse_if_moving(self.volume(),
                                                         'a snapshot'))
        self.moved()
        exc = self.assertRaises(move.MoveInProgress,
                                self.a.source.refuse_if_moving,
                                self.volume(), 'a snapshot')
        self.assertIn('a snapshot is possible once', str(exc))
        self.assertIn('0.0%', str(exc))


class StaleHostAfterKeptRollbackTestCase(ClusterTestCase):
    """R7-2: requests routed by a volume object older than the rollback.

    A rollback whose clone lost its metadata LV keeps node-b's LV (named
    like the volume) and points the record back at node-a.  Review 6
    refused a local attach that *waited for the lock* during that
    rollback; a request that reaches node-b just after it, or an extend,
    still treats the kept LV as the volume.
    """

    def roll_back_keeping_lv(self):
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 2)
        self.b.reboot()
        self.b.vg.delete(META)
        self.b.recover()
        stale = self.volume()               # cinder-api's read: node-b
        self.assertEqual(self.b.host, stale.host)
        return src, dst, stale

    def attach_here_as_the_driver_does(self, volume):
        """The driver's create_export, then initialize_connection, here.

        (A connector on node-b: both map the handle, _ensure_handle, as
        a request serving the volume from here.)
        """
        drv = mock.Mock(destination=self.b.destination, metadata_vg=None,
                        vg=self.b.vg)
        drv.moves.recovery.pending_rebuild = {}
        # create_export (local connector): _ensure_handle, no other check
        dmc_driver.DMCloneVolumeDriver._refuse_linear_over_clone(
            drv, volume, 'attaching on node-b')
        self.b.ensure_handle()
        # initialize_connection (local connector)
        self.b.source.refuse_local_attach(volume, 'attaching it here')
        return self.b.ensure_handle()

    def test_local_attach_just_after_the_rollback_is_refused(self):
        src, dst, stale = self.roll_back_keeping_lv()
        self.c.detach(dst)                  # the rollback, kept LV
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIn(LV, self.b.vg.lvs)
        # The attach routed to node-b by the stale read runs now.
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.attach_here_as_the_driver_does, stale)
        self.assertNotIn(HANDLE, self.b.dm.devices)

    def test_extend_racing_the_rollback_does_not_grow_the_kept_lv(self):
        # os-extend (an owner's call) read the volume while the record
        # named node-b; it waits for the lock the rollback detach holds.
        src, dst, stale = self.roll_back_keeping_lv()
        locking = move.lock
        raced = []

        def lock(volume_id):
            if not raced:
                raced.append(volume_id)
                self.c.detach(dst)
            return locking(volume_id)
        self.mock_object(move, 'lock', side_effect=lock)
        grown = []
        self.assertRaises(
            exception.VolumeBackendAPIException,
            self.b.destination.extend, stale,
            lambda: grown.append(self.b.vg.extend_volume(LV, '2g')))
        self.assertEqual([], grown)

    def assert_delete_refused_and_nothing_gone(self, stale):
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.b.delete_volume, stale)
        self.assertIn('lives on %s' % self.a.host, str(exc))
        # The kept LV is an operator's (it may hold the instance's last
        # writes): neither wiped nor removed ...
        self.assertIn(LV, self.b.vg.lvs)
        self.assertEqual([], self.b.wiped)
        # ... and the volume itself, on node-a, is untouched.
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertIn(HANDLE, self.a.dm.devices)
        self.assertEqual([], self.c.violations)

    def test_delete_just_after_the_rollback_is_refused(self):
        # Review 9: a delete routed to node-b by cinder-api's read made
        # while the record still named node-b reaches node-b after the
        # rollback.  Before, no move was recorded any more, so node-b
        # removed the LV named like the volume -- the kept copy -- and
        # reported the volume deleted, whose copy on node-a lived on
        # with no record.
        src, dst, stale = self.roll_back_keeping_lv()
        self.c.detach(dst)                  # the rollback, kept LV
        self.assertIn(LV, self.b.vg.lvs)
        self.assert_delete_refused_and_nothing_gone(stale)

    def test_delete_racing_the_rollback_is_refused(self):
        # The delete waits for the lock the rollback detach holds: under
        # the lock no move is recorded any more, and the record names
        # node-a.
        src, dst, stale = self.roll_back_keeping_lv()
        locking = move.lock
        raced = []

        def lock(volume_id):
            if not raced:
                raced.append(volume_id)
                self.c.detach(dst)
            return locking(volume_id)
        self.mock_object(move, 'lock', side_effect=lock)
        self.assert_delete_refused_and_nothing_gone(stale)
        self.assertEqual(1, len(raced))


class ThinMapTestCase(ClusterTestCase):
    """A detached thin volume moves only its data (thin-map.rst)."""

    MAPPED = ((0, 16), (8000, 8100))        # 64 KiB blocks = regions

    def setUp(self):
        super().setUp()
        self.thin_cluster()

    def thin_cluster(self, thin_map=True, mapped=MAPPED, **kwargs):
        self.c = fake_cluster.Cluster(self, thin=True, thin_map=thin_map,
                                      mapped=mapped, **kwargs)
        self.a = self.c.a
        self.b = self.c.b

    def discarded(self):
        return len(self.b.dm.discarded.get(META_PATH, ()))

    def prepare_step(self):
        [step] = [call[2] for call in self.c.rpc.calls
                  if call[2] and call[2]['op'] == peer.PREPARE]
        return step

    def test_migrate_copies_only_the_mapped_regions(self):
        self.assertTrue(self.c.migrate(self.b))
        total = SECTORS // fake_cluster.REGION
        # 116 regions hold data; the rest is hydrated without a copy
        self.assertEqual(total - 116, self.discarded())
        status = self.b.dm.status(HANDLE)[0].clone
        self.assertEqual(total - 116, status.hydrated_regions)
        self.assertTrue(status.hydration_enabled)
        self.assertIn('no_discard_passdown', status.features)
        self.assertIn(peer.REGION_MAP, self.prepare_step())
        self.assertEqual(['thin_device', 'thin_table', 'thin_status',
                          'table', 'reserve_metadata_snap', 'thin_dump',
                          'release_metadata_snap'], self.a.pool.calls)
        self.c.settle()
        self.c.assert_completed()

    def test_a_destination_pool_with_no_thin_lv_yet_takes_the_map(self):
        # Testbed run 20261126-203634-19093: LVM had not activated node
        # B's empty pool (no -tpool device), its zeroing could not be
        # read and the map was refused.  LVM's record answers before the
        # build; the kernel's table is read once the LVs exist.
        self.b.pool.inactive_when_empty = True
        self.assertEqual({}, self.b.vg.lvs)
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(SECTORS // fake_cluster.REGION - 116,
                         self.discarded())
        self.assertIn('zero_recorded', self.b.pool.calls)
        self.assertIn('table', self.b.pool.calls)
        self.c.settle()
        self.c.assert_completed()

    def test_an_inactive_pool_recorded_not_zeroing_copies_everything(self):
        self.b.pool.inactive_when_empty = True
        self.b.pool.zeroing = False
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(0, self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_attach_of_a_detached_volume_elsewhere_uses_the_map(self):
        self.moved()
        self.assertEqual(SECTORS // fake_cluster.REGION - 116,
                         self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_empty_thin_volume_copies_nothing(self):
        self.thin_cluster(mapped=())
        self.c.migrate(self.b)
        self.assertEqual(SECTORS // fake_cluster.REGION, self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_live_migration_copies_everything(self):
        src, dst = self.moved(live=True)
        self.assertNotIn(peer.REGION_MAP, self.prepare_step())
        self.assertEqual([], self.a.pool.calls)
        self.c.detach(src)
        self.c.settle()
        self.assertEqual(0, self.discarded())
        self.c.assert_completed()

    def test_option_off_on_the_source_sends_no_map(self):
        self.thin_cluster(thin_map=False)
        self.c.migrate(self.b)
        self.assertNotIn(peer.REGION_MAP, self.prepare_step())
        self.assertEqual(0, self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_option_off_on_the_destination_copies_everything(self):
        self.b.destination.thin_map = False
        self.c.migrate(self.b)
        self.assertIn(peer.REGION_MAP, self.prepare_step())
        self.assertEqual(0, self.discarded())
        self.assertNotIn('no_discard_passdown', self.features())
        self.c.settle()
        self.c.assert_completed()

    def test_destination_pool_without_zeroing_copies_everything(self):
        self.b.pool.zeroing = False
        self.c.migrate(self.b)
        self.assertEqual(0, self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_thick_destination_copies_everything(self):
        self.b.dest.lvm_type = 'default'
        self.c.migrate(self.b)
        self.assertEqual(0, self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_map_for_another_geometry_is_not_applied(self):
        take = self.a.source.thin_maps.take
        self.mock_object(self.a.source.thin_maps, 'take',
                         side_effect=lambda lv, sectors, region:
                         take(lv, sectors // 2, region))
        self.c.migrate(self.b)
        self.assertEqual(0, self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def test_external_origin_sends_no_map(self):
        self.a.pool.external.add(LV)
        self.c.migrate(self.b)
        self.assertNotIn(peer.REGION_MAP, self.prepare_step())
        self.assertFalse(self.a.pool.held)
        self.c.settle()
        self.c.assert_completed()

    def test_handle_open_here_sends_no_map(self):
        # (Something outside Cinder holds the LV: it may write.)
        self.a.dm.openers[HANDLE] = 1
        self.c.migrate(self.b)
        self.assertNotIn(peer.REGION_MAP, self.prepare_step())
        self.assertEqual(0, self.discarded())

    def test_another_tools_snapshot_means_a_full_copy(self):
        self.a.pool.held = True
        self.c.migrate(self.b)
        self.assertEqual(0, self.discarded())
        self.assertTrue(self.a.pool.held)     # not ours: left alone
        self.a.pool.held = False
        self.c.settle()
        self.c.assert_completed()

    def test_kernel_counting_otherwise_gives_the_move_up(self):
        discard = self.b.dm.discard
        # (A kernel that left the last region of each range unhydrated.)
        self.b.dm.discard = lambda name, start, sectors: discard(
            name, start, sectors - fake_cluster.REGION)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    # R11-6: the pool's zeroing is what makes a discarded region read
    # zeroes once a neighbour in its chunk is copied; it was read once,
    # before the build.  Turned off since (lvchange --zero n, a reload of
    # the pool), a copied region would leave another tenant's old blocks
    # in the discarded regions of its chunk.
    def test_zeroing_turned_off_during_the_build_gives_the_move_up(self):
        self.zeroing_off_after_the_map()
        self.log.reset_mock()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        errors = str(self.log.error.call_args_list)
        self.assertIn('skip_block_zeroing', errors)
        self.assertIn(self.b.pool.pool, errors)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_an_inactive_pool_turned_off_during_the_build_gives_up(self):
        # The pool had no thin LV: LVM's record answered before the build
        # (zeroing), then the pool was turned off (lvchange --zero n)
        # before the LVs existed.  The kernel's table, read once they
        # do, must win over the record read before.
        self.b.pool.inactive_when_empty = True
        recorded = self.b.pool._zero_recorded

        def then_zeroing_off(cmd, lvs):
            answer = recorded(cmd, lvs)
            self.b.pool.zeroing = False
            return answer
        self.mock_object(self.b.pool, '_zero_recorded',
                         side_effect=then_zeroing_off)
        self.log.reset_mock()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertIn('zero_recorded', self.b.pool.calls)
        self.assertIn('skip_block_zeroing',
                      str(self.log.error.call_args_list))
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_zeroing_turned_off_while_it_hydrates_stops_the_copy(self):
        self.assertTrue(self.c.migrate(self.b))
        self.b.pool.zeroing = False
        self.log.reset_mock()
        self.b.monitor.tick()
        self.assertIn(self.b.pool.pool, str(self.log.error.call_args_list))
        status = self.b.dm.status(HANDLE)[0].clone
        self.assertFalse(status.hydration_enabled)
        self.b.monitor.tick()           # (still off: stays stopped)
        self.assertFalse(self.b.dm.status(HANDLE)[0].clone.hydration_enabled)
        self.b.pool.zeroing = True
        self.b.monitor.tick()
        self.assertTrue(self.b.dm.status(HANDLE)[0].clone.hydration_enabled)
        self.c.settle()
        self.c.assert_completed()

    def test_zeroing_is_not_read_for_a_clone_without_a_map(self):
        self.thin_cluster(thin_map=False)
        self.c.migrate(self.b)
        self.b.pool.zeroing = False
        self.b.pool.calls.clear()
        self.b.monitor.tick()
        self.assertNotIn('table', self.b.pool.calls)
        self.assertTrue(self.b.dm.status(HANDLE)[0].clone.hydration_enabled)

    def test_a_thick_clone_that_cannot_discard_keeps_hydrating(self):
        # Found on the real kernel (run 20261126-165404-2326): dm-clone
        # reports no_discard_passdown by itself over a destination that
        # cannot discard (a thick LV on the testbed's disks); the guard
        # took that for a mapped clone, found no zeroing thin pool and
        # stopped the copy of every live migration for good.
        self.c = fake_cluster.Cluster(self)
        self.a = self.c.a
        self.b = self.c.b
        self.b.dm.cannot_discard = True
        self.assertTrue(self.c.migrate(self.b))
        self.b.monitor.tick()
        status = self.b.dm.status(HANDLE)[0].clone
        self.assertIn('no_discard_passdown', status.features)
        self.assertTrue(status.hydration_enabled)
        self.assertNotIn('zeroes new blocks', str(
            self.log.error.call_args_list))
        self.c.settle()
        self.c.assert_completed()

    def test_an_unmapped_thin_clone_that_cannot_discard_keeps_hydrating(
            self):
        # (A pool made with --discards ignore: its thin LVs cannot
        # discard.  With zeroing off, a clone that copies every region is
        # still right: only a mapped one depends on the zeroing.)
        self.thin_cluster(thin_map=False)
        self.b.dm.cannot_discard = True
        self.b.pool.zeroing = False
        self.c.migrate(self.b)
        self.b.monitor.tick()
        self.assertTrue(self.b.dm.status(HANDLE)[0].clone.hydration_enabled)
        self.c.settle()
        self.c.assert_completed()

    def test_source_crash_holding_the_snapshot_releases_it_at_start(self):
        self.c.crash_at(fake_cluster.privileged, 'thin_dump')
        self.assertRaises(oslo_messaging.MessagingTimeout, self.c.migrate,
                          self.b)
        # (node-a restarted before anyone timed out: its start released
        # the snapshot its record named, and gave the move up.)
        self.assertFalse(self.a.pool.held)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_harness_catches_unsafe_discards(self):
        self.saved()
        t = self.c.transfer()
        self.b.vg.add(META, '8m')
        privileged.zero_metadata_head(META_PATH, execute=self.b.execute)
        self.b.vg.create_volume(LV, '1g', 'thin')
        source = self.b.dest.connect_source(t, None)
        self.b.dest.build_clone(t, source, True)
        privileged.discard_regions(fake_cluster.VG, LV, [(0, 256)],
                                   execute=self.b.execute)
        prefix = 'node-b: regions 0-2 of %s discarded ' % HANDLE
        self.assertEqual(
            [prefix + 'with hydration on',
             prefix + 'passed down to the data LV',
             prefix + 'over regions the source holds data in: [0, 1]'],
            self.c.violations)

    # Issue 19, item 1: node-b's thin pool counts what the map copies.

    def small_pool(self):
        """node-b's pool: 100 GiB, 0.5 GiB free.

        The 1 GiB volume does not fit whole; its 116 regions and room for
        the rest do.
        """
        self.b.pool.size = 100 * 1024 ** 3
        self.b.pool.data_percent = 99.5

    def test_a_move_that_fits_only_with_its_map_is_taken(self):
        self.small_pool()
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(SECTORS // fake_cluster.REGION - 116,
                         self.discarded())
        self.c.settle()
        self.c.assert_completed()

    def refused_whole(self):
        # (ThinPoolFull on node-b, through the RPC.)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b)
        self.assertIn('0.50 GiB of data space free', str(exc))
        self.assertIn('every region of the volume (1.00 GiB)', str(exc))
        self.assertNotIn(LV, self.b.vg.lvs)
        self.assertEqual(0, self.discarded())
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_option_off_on_the_destination_counts_the_whole_volume(self):
        self.small_pool()
        self.b.destination.thin_map = False
        self.b.dest.thin_map = False
        self.refused_whole()

    def test_a_pool_that_does_not_zero_counts_the_whole_volume(self):
        self.small_pool()
        self.b.pool.zeroing = False
        self.refused_whole()

    def test_a_map_for_another_geometry_counts_the_whole_volume(self):
        self.small_pool()
        take = self.a.source.thin_maps.take
        self.mock_object(self.a.source.thin_maps, 'take',
                         side_effect=lambda lv, sectors, region:
                         take(lv, sectors // 2, region))
        self.refused_whole()

    def test_a_map_not_applied_after_the_check_gives_the_move_up(self):
        # Counted with its map, the move must never copy every region:
        # a map that fails to apply gives it up before any copy.
        self.small_pool()
        self.mock_object(privileged, 'discard_regions',
                         side_effect=dmc_exception.PrivilegedCommandFailed(
                             command='blkdiscard', reason='boom'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertNotIn(LV, self.b.vg.lvs)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_snapshot_left_held_is_released_by_the_next_move(self):
        self.a.thin_maps()._write_record(self.a.pool.pool)
        self.a.pool.held = True
        self.c.migrate(self.b)
        self.assertEqual(SECTORS // fake_cluster.REGION - 116,
                         self.discarded())
        self.c.settle()
        self.c.assert_completed()


class InvariantsTestCase(ClusterTestCase):
    """The harness itself catches what the crash tests rule out."""

    def test_linear_over_partial_lv(self):
        self.b.vg.create_volume(LV, '1g')
        self.b.ensure_handle()
        self.assertIn('not fully hydrated', self.c.violations[0])

    def test_metadata_zeroed_twice(self):
        self.b.vg.add(META, '8m')
        privileged.zero_metadata_head(META_PATH, execute=self.b.execute)
        privileged.zero_metadata_head(META_PATH, execute=self.b.execute)
        self.assertIn('zeroed again', self.c.violations[0])

    def test_clone_over_unzeroed_metadata(self):
        self.saved()
        t = self.c.transfer()
        self.b.vg.add(META, '8m')
        self.b.vg.create_volume(LV, '1g')
        source = self.b.dest.connect_source(t, None)
        self.b.dest.build_clone(t, source, True)
        self.assertIn('zeroed 0 times', self.c.violations[0])
        privileged.zero_metadata_head(META_PATH, execute=self.b.execute)
        self.assertIn('under a live clone', self.c.violations[1])
        self.b.dest.disconnect_source(t, None)
        self.assertIn('dropped under a live table', self.c.violations[2])

    def test_lock_is_not_reentrant(self):
        with move.lock(VOLUME_ID):
            self.assertRaises(AssertionError,
                              move.lock(VOLUME_ID).__enter__)
        self.assertIn('taken twice', self.c.violations[0])


# Steps of the destination's flow: (object, attribute, call matcher).
def _state_is(state):
    return lambda ctxt, t, expected, new_state: new_state == state


def _after_build(c):
    """Match calls made once node-b has built the clone."""
    return lambda *args, **kwargs: c.built


def _deleting(c):
    return lambda *args, **kwargs: c.deleting


def _during(c, state):
    """Match calls made while the transfer is in ``state``."""
    def match(*args, **kwargs):
        t = c.transfer()
        return t is not None and t.state == state
    return match


STEPS = {
    'clean_leftovers': lambda c, f: (
        c.b.dest, 'tear_down', _during(c, move.PREPARING)),
    'create_volumes': lambda c, f: (c.b.dest, 'create_volumes', None),
    'create_metadata_lv': lambda c, f: (
        c.b.vg, 'create_volume', lambda name, *a: name == META),
    'zero_metadata': lambda c, f: (c.b.dest, '_zero_head', None),
    'create_data_lv': lambda c, f: (
        c.b.vg, 'create_volume', lambda name, *a: name == LV),
    'connect_source': lambda c, f: (c.b.dest, 'connect_source', None),
    'build_clone': lambda c, f: (c.b.dest, 'build_clone', None),
    # (Recorded by the source, which holds the lock while it waits for the
    # destination's answer: a crash of node-a here.)
    'set_state_prepared': lambda c, f: (
        c.a.store, 'transition', _state_is(
            move.CLONED if f == 'live' else move.HYDRATING)),
    'enable_hydration': lambda c, f: (c.b.dest, 'enable_hydration', None),
    'set_state_committed': lambda c, f: (
        c.b.store, 'transition', _state_is(move.HYDRATING)),
    'set_state_finalizing': lambda c, f: (
        c.b.store, 'transition', _state_is(move.FINALIZING)),
    'swap_to_linear': lambda c, f: (c.b.dest, 'swap_to_linear', None),
    'remove_metadata': lambda c, f: (
        c.b.dest, 'remove_metadata', _during(c, move.FINALIZING)),
    'disconnect_source': lambda c, f: (
        c.b.dest, 'disconnect_source', _during(c, move.FINALIZING)),
    'peer_retire': lambda c, f: (
        c.b.peer, 'request', lambda *args, **kwargs: args[-2] == peer.RETIRE),
    'clear_provider_fields': lambda c, f: (
        c.db, 'volume_update',
        lambda ctxt, vid, values: 'provider_location' in values
        and values['provider_location'] is None),
    'clear': lambda c, f: (c.b.store, 'clear', None),
    # The thin map (thin-map.rst): node-a reads it, node-b applies it.
    'map_record': lambda c, f: (c.a.source.thin_maps, '_write_record', None),
    'map_reserve': lambda c, f: (privileged, 'reserve_metadata_snap', None),
    'map_dump': lambda c, f: (privileged, 'thin_dump', None),
    'map_release': lambda c, f: (privileged, 'release_metadata_snap', None),
    'map_discard': lambda c, f: (privileged, 'discard_regions', None),
    'map_commit': lambda c, f: (
        c.b.dest, '_clone_status',
        lambda *args: bool(c.b.dm.discarded.get(META_PATH))),
    # cinder migrate, on node-a: the export made for it, and the
    # manager's record of the outcome after the driver moved it.
    'mig_create_export': lambda c, f: (c.a.target, 'create_export', None),
    'mig_manager_records': lambda c, f: (
        c.db, 'volume_update',
        lambda ctxt, vid, values: values.get('migration_status')
        == 'success'),
    'clear_part_way': lambda c, f: (
        c.db, 'volume_admin_metadata_delete', None),
    # A failed live migration's rollback, on node-b.
    'rb_remove_handle': lambda c, f: (
        c.b.dm, 'remove', _during(c, move.CLONED)),
    'rb_disconnect': lambda c, f: (
        c.b.dest, 'disconnect_source', _during(c, move.CLONED)),
    'rb_discard_data': lambda c, f: (
        c.b.wiper, 'discard', lambda name: name == LV),
    'rb_wipe': lambda c, f: (c.b.wiper, 'wipe', None),
    'rb_remove_metadata': lambda c, f: (
        c.b.dest, 'remove_metadata', _during(c, move.CLONED)),
    'rb_move_volume': lambda c, f: (
        c.db, 'volume_update',
        lambda ctxt, vid, values: values.get('host') == c.a.host),
    'rb_release': lambda c, f: (
        c.b.peer, 'request', lambda *args, **kwargs: args[-2] == peer.RELEASE),
    'rb_clear': lambda c, f: (
        c.b.store, 'clear', _during(c, move.CLONED)),
    # node-b removing what it built after the source gave up.
    'ab_remove_handle': lambda c, f: (
        c.b.dm, 'remove', _after_build(c)),
    'ab_discard_data': lambda c, f: (
        c.b.wiper, 'discard', _after_build(c)),
    'ab_wipe': lambda c, f: (c.b.wiper, 'wipe', _after_build(c)),
    'ab_remove_metadata': lambda c, f: (
        c.b.dest, 'remove_metadata', _after_build(c)),
    # A delete of the volume while it hydrates on node-b.
    'del_remove_handle': lambda c, f: (
        c.b.dm, 'remove', _deleting(c)),
    'del_discard_data': lambda c, f: (
        c.b.wiper, 'discard', _deleting(c)),
    'del_wipe': lambda c, f: (c.b.wiper, 'wipe', _deleting(c)),
    'del_remove_metadata': lambda c, f: (
        c.b.dest, 'remove_metadata', _deleting(c)),
    'del_retire': lambda c, f: (
        c.b.peer, 'request', lambda *args, **kwargs: args[-2] == peer.RETIRE),
    'del_clear': lambda c, f: (c.b.store, 'clear', _deleting(c)),
}
PREPARE = ('clean_leftovers', 'create_volumes', 'create_metadata_lv',
           'zero_metadata', 'create_data_lv', 'connect_source', 'build_clone',
           'set_state_prepared')
COMMIT = ('enable_hydration', 'set_state_committed')
FINALIZE = ('set_state_finalizing', 'swap_to_linear', 'remove_metadata',
            'disconnect_source', 'peer_retire', 'clear_provider_fields',
            'clear', 'clear_part_way')
ROLLBACK = ('rb_remove_handle', 'rb_disconnect', 'rb_discard_data',
            'rb_wipe', 'rb_remove_metadata', 'rb_move_volume', 'rb_release',
            'rb_clear')
ABORT = ('ab_remove_handle', 'ab_discard_data', 'ab_wipe',
         'ab_remove_metadata')
MIGRATE = ('mig_create_export',) + PREPARE + ('mig_manager_records',)
DELETE = ('del_remove_handle', 'del_discard_data', 'del_wipe',
          'del_remove_metadata', 'del_retire', 'del_clear')
THIN_SOURCE = ('map_record', 'map_reserve', 'map_dump', 'map_release')
THIN_PREPARE = PREPARE[:-1] + ('map_discard', 'map_commit',
                               'enable_hydration') + PREPARE[-1:]


def _thin_cases():
    """A detached thin volume's move with its map, at every step.

    node-a dies while it holds the pool's metadata snapshot (or just
    before, or after), node-b while it discards through the clone; both
    before anything is committed: the move rolls back, and no snapshot
    stays held.  Past the commit nothing differs from a full copy.
    """
    for mode in ('restart', 'reboot', 'late'):
        for flow in ('thin_available', 'thin_migrate'):
            steps = THIN_SOURCE + THIN_PREPARE
            if flow == 'thin_migrate':
                steps = ('mig_create_export',) + steps
            if mode != 'late':
                steps += FINALIZE
            for step in steps:
                for when in ('before', 'after'):
                    if step == 'clear_part_way' and when == 'before':
                        continue
                    committed = step in FINALIZE or (
                        step, when) == ('set_state_prepared', 'after')
                    yield (mode, flow, step, when,
                           'completed' if committed else 'rolled_back')


def _cases():
    yield from _thin_cases()
    # The service is back only after the source gave up waiting (what a
    # kill -9 of the destination looks like to the source): the source
    # aborts, the destination's recovery removes what it built.
    for step in PREPARE:
        for when in ('before', 'after'):
            yield ('late', 'live', step, when, 'rolled_back')
            # (node-a recorded the migration's commit before it died.)
            yield ('late', 'migrate', step, when, 'completed' if (
                step, when) == ('set_state_prepared', 'after')
                else 'rolled_back')
    for mode in ('restart', 'reboot'):
        for flow in ('available', 'live', 'migrate', 'migrate_name_id'):
            if flow.startswith('migrate'):
                steps = MIGRATE + FINALIZE
            else:
                steps = PREPARE + (COMMIT if flow == 'live' else ()) \
                    + FINALIZE
            for step in steps:
                for when in ('before', 'after'):
                    if step == 'clear_part_way' and when == 'before':
                        continue
                    outcome = 'rolled_back' if step in PREPARE \
                        or step == 'mig_create_export' else 'completed'
                    if flow != 'live' and (step, when) == (
                            'set_state_prepared', 'after'):
                        # (node-a recorded the commit, hydrating, and
                        # died before naming node-b in the volume record:
                        # the committed move is left to node-b, which
                        # names itself when it finalizes.)
                        outcome = 'completed'
                    yield (mode, flow, step, when, outcome)
        for flow, steps, outcome in (('rollback', ROLLBACK, 'rolled_back'),
                                     ('abort', ABORT, 'rolled_back'),
                                     ('delete', DELETE, 'deleted')):
            for step in steps:
                for when in ('before', 'after'):
                    yield (mode, flow, step, when, outcome)


@ddt.ddt
class CrashTestCase(test.TestCase):
    """A crash at any step of a transfer ends consistent after recovery.

    The destination's service dies right before or right after a step;
    it restarts (or the node reboots) and runs recovery before the source
    gives up waiting; Nova retries a detach that timed out; the monitor
    ticks.  The end is either a complete rollback (the volume on node-a
    only) or a complete move (node-b only), with no invariant violated on
    the way.
    """

    @staticmethod
    def retried(call, *args):
        """Nova (or the user) retries a call that timed out."""
        for attempt in range(3):
            try:
                return call(*args)
            except oslo_messaging.MessagingTimeout:
                continue

    def watch_build(self, c):
        build = c.b.dest.build_clone

        def built(*args, **kwargs):
            path = build(*args, **kwargs)
            c.built = True
            return path
        self.mock_object(c.b.dest, 'build_clone', side_effect=built)

    def drive(self, c, flow):
        c.built = c.deleting = False
        flow = flow[len('thin_'):] if flow.startswith('thin_') else flow
        if flow in ('rollback', 'abort', 'delete'):
            return getattr(self, 'drive_' + flow)(c)
        if flow.startswith('migrate'):
            return self.drive_migrate(c)
        src = c.attach(c.a)[0] if flow == 'live' else None
        try:
            c.attach(c.b)
        except (exception.VolumeBackendAPIException,
                oslo_messaging.MessagingTimeout):
            # The move failed (or the source died answering): Nova gives
            # up, the instance stays.
            c.settle()
            return
        if src is not None:
            for attempt in range(2):
                try:
                    c.detach(src)
                    break
                except oslo_messaging.MessagingTimeout:
                    continue
        c.settle()

    def drive_migrate(self, c):
        """An admin's cinder migrate of the detached volume to node-b.

        A failed one is not retried: the volume stays on node-a, and
        Cinder's manager records the migration failed (or, if node-a
        died, leaves it ``migrating`` for an admin to reset).
        """
        try:
            c.migrate(c.b)
        except (exception.VolumeBackendAPIException,
                oslo_messaging.MessagingTimeout):
            pass
        c.settle()

    def drive_rollback(self, c):
        """A live migration that fails before the instance wrote."""
        src = c.attach(c.a)[0]
        dst = c.attach(c.b)[0]
        self.retried(c.detach, dst)
        c.settle()
        self.assertEqual([src], c.attachments)

    def drive_abort(self, c):
        """Nova withdraws the attach while node-b builds."""
        self.watch_build(c)
        c.withdraw_attach_during_build()
        self.assertRaises(exception.VolumeBackendAPIException,
                          c.attach, c.b)
        c.settle()

    def drive_delete(self, c):
        """The volume is deleted while it hydrates on node-b."""
        dst = c.attach(c.b)[0]
        c.detach(dst)
        c.deleting = True
        for attempt in range(3):
            try:
                c.delete()
                break
            except (oslo_messaging.MessagingTimeout,
                    exception.VolumeBackendAPIException):
                continue    # error_deleting: the user deletes again
        c.settle()

    @ddt.data(*_cases())
    @ddt.unpack
    def test_crash(self, mode, flow, step, when, outcome):
        thin = flow.startswith('thin_')
        c = fake_cluster.Cluster(self, reboot=(mode == 'reboot'),
                                 restart_before_timeout=(mode != 'late'),
                                 thin=thin, thin_map=thin)
        c.built = c.deleting = False
        if flow == 'migrate_name_id':
            # (Its LV is not named after its id: see NameIdTestCase.)
            c.give_name_id()
        if flow == 'abort':
            self.watch_build(c)
        obj, attr, match = STEPS[step](c, flow)
        record = c.crash_at(obj, attr, when, match)
        self.drive(c, flow)
        if mode == 'late':
            down = [node for node in (c.a, c.b) if node.down]
            self.assertEqual(1, len(down))
            c.restart(down[0])
            # (A committed move finalizes once its source is back.)
            c.settle()
        self.assertTrue(record['fired'], 'the crash never happened')
        if outcome == 'rolled_back':
            # (A source that gave up while node-b was down keeps an inert
            # 'aborted' record when node-b had nothing left to find.)
            c.assert_rolled_back(aborted_ok=mode == 'late' or flow == 'abort')
        elif outcome == 'deleted':
            c.assert_deleted()
        else:
            c.assert_completed()

    def test_happy_paths_have_no_crash(self):
        for flow in ('available', 'live', 'migrate', 'thin_available',
                     'thin_migrate'):
            thin = flow.startswith('thin_')
            c = fake_cluster.Cluster(self, thin=thin, thin_map=thin)
            self.drive(c, flow)
            c.assert_completed()
            self.assertEqual({}, c.transfer_keys())
            if thin:
                # (The map was applied: not every region was copied.)
                self.assertIn('discard', [call[0] for call in c.b.dm.calls])
