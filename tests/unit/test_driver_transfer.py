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

"""How the driver hands moves to this node's sides."""

from unittest import mock

import ddt
from oslo_concurrency import processutils

from cinder.brick.local_dev import lvm as brick_lvm
from cinder import exception
from cinder.message import api as message_api
from cinder.message import message_field
from cinder import objects
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_volume
from cinder.tests.unit import test
from cinder.volume.drivers import lvm as cinder_lvm
from cinder.volume import volume_utils

from cinder_dmclone import destination
from cinder_dmclone import dmsetup
from cinder_dmclone import driver
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import hydration
from cinder_dmclone import move
from cinder_dmclone import peer
from cinder_dmclone import recovery
from cinder_dmclone import source
from tests.unit import test_driver
from tests.unit.test_driver import HANDLE
from tests.unit.test_driver import HANDLE_PATH
from tests.unit.test_driver import LOCAL
from tests.unit.test_driver import LV
from tests.unit.test_driver import LV_PATH
from tests.unit.test_driver import REMOTE

STEP = {'op': 'prepare', 'hydrate': True, 'size_gb': 1}


def transfer_metadata(state=move.HYDRATING, dest='node-a',
                      source='node-b'):
    return move.Move(
        volume_id=fake.VOLUME_ID, lv_name=LV, state=state,
        source_host='%s@dmclone#dmclone' % source,
        dest_host='%s@dmclone#dmclone' % dest, source_node=source,
        dest_node=dest, region_sectors=128, clone_sectors=2097152,
        target_portal='10.0.0.2:3260',
        target_iqn='iqn.2010-10.org.openstack:%s' % LV).to_metadata()


def moving():
    """What a side raises for a volume in the middle of a move."""
    return move.MoveInProgress(
        volume_name=LV, source='node-a', dest='node-b', state='cloned',
        percent='0.0', action='this')


@ddt.ddt
class MockMovesTestCase(test_driver.DriverTestBase):
    """The driver over mock sides of a move: which entry point goes where.

    The driver's MoveService is replaced by one whose source, destination,
    endpoint, tracker and recovery are autospec'd mocks: a call with the
    wrong arguments fails here too.
    """

    def setUp(self):
        super().setUp()
        self.moves = mock.Mock(spec=['source', 'destination', 'endpoint',
                                     'tracker', 'recovery', 'monitor'])
        self.source = self.moves.source = mock.create_autospec(
            source.Source, instance=True)
        self.destination = self.moves.destination = mock.create_autospec(
            destination.Destination, instance=True)
        self.endpoint = self.moves.endpoint = mock.create_autospec(
            peer.Endpoint, instance=True)
        self.tracker = self.moves.tracker = mock.create_autospec(
            hydration.HydrationTracker, instance=True)
        self.recovery = self.moves.recovery = mock.create_autospec(
            recovery.Recovery, instance=True)
        self.recovery.pending_rebuild = {}
        self.source.load.return_value = None
        self.source.is_source.return_value = False
        self.source.wants_move.return_value = False
        # (The lock and the move check are Source's; see test_source.)
        self.source.connect_over_iscsi.side_effect = (
            lambda volume, connector, connect: connect(volume, connector))
        # (So is the check that nothing else uses a migration's export.)
        self.source.drop_migration_export.side_effect = (
            lambda volume, connector, remove: remove())
        self.destination.delete.return_value = False
        # (LVM's own listing of the data group, which a delete reads.)
        self.destination.clones = mock.Mock(spec=['lv_names'])
        self.destination.clones.lv_names.side_effect = (
            lambda vg: frozenset(self.lvs))
        self.destination.extend.return_value = False
        self.destination.detached.return_value = False
        self.destination.load.return_value = None
        self.destination.is_dest.return_value = False
        self.destination.metadata_here.return_value = False
        self.source.keeps_acl.return_value = False
        self.endpoint.receive.return_value = None
        self.drv._moves = self.moves

    # -- cinder migrate: a move of a detached volume -----------------------

    def _dest(self, **caps):
        values = dict(dmclone_node='node-b',
                      dmclone_initiator=REMOTE['initiator'],
                      volume_backend_name='dmclone')
        values.update(caps)
        return {'host': 'node-b@dmclone#dmclone', 'capabilities': values}

    def test_migrate_is_a_move(self):
        self.volume.host = 'node-a@dmclone#dmclone'
        self.source.move.return_value = {'driver_volume_type': 'local'}
        export = self.mock_object(self.drv, 'create_export',
                                  return_value={'provider_location': 'loc',
                                                'provider_auth': 'CHAP u p'})
        save = self.mock_object(self.volume, 'save')
        self.assertEqual((True, None), self.drv.migrate_volume(
            self.ctxt, self.volume, self._dest()))
        connector = {'host': 'node-b', 'initiator': REMOTE['initiator']}
        self.source.end_stale_prepare.assert_called_once_with(self.volume)
        self.source.refuse_if_moving.assert_called_once_with(
            self.volume, 'a migration to node-b')
        export.assert_called_once_with(self.ctxt, self.volume, connector)
        # Saved before the move: the destination logs in with its CHAP.
        save.assert_called_once_with()
        self.assertEqual('CHAP u p', self.volume.provider_auth)
        # (migration: Source.move refuses if an attach started since)
        self.source.move.assert_called_once_with(self.volume, connector,
                                                 mock.ANY, migration=True)
        # (the LV's length, read when Source.move holds the lock)
        self.assertEqual(2097152, self.source.move.call_args[0][2]())

    def test_migrate_without_the_destination_service_is_generic(self):
        self.volume.host = 'node-a@dmclone#dmclone'
        self.mock_object(self.volume, 'save')
        self.source.move.return_value = None
        self.mock_object(self.drv, 'create_export',
                         return_value={'provider_location': 'loc',
                                       'provider_auth': 'CHAP u p'})
        remove = self.mock_object(self.drv, 'remove_export')
        self.assertEqual((False, None), self.drv.migrate_volume(
            self.ctxt, self.volume, self._dest()))
        remove.assert_called_once_with(self.ctxt, self.volume)
        self.assertIsNone(self.volume.provider_location)

    def test_failed_migrate_raises(self):
        # (The manager records migration_status=error; Source.move has
        # dropped the export and given the move up.)
        self.volume.host = 'node-a@dmclone#dmclone'
        self.mock_object(self.volume, 'save')
        self.source.move.side_effect = exception.VolumeBackendAPIException(
            data='no space')
        self.mock_object(self.drv, 'create_export', return_value={})
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.migrate_volume, self.ctxt, self.volume,
                          self._dest())

    def test_failed_migrate_drops_its_export(self):
        # Refused before any move was recorded (snapshots, a short LV,
        # the destination's service down): the export made for it goes,
        # and the record stops naming it, as before the migration.
        self.volume.host = 'node-a@dmclone#dmclone'
        self.mock_object(self.volume, 'save')
        self.mock_object(self.drv, 'create_export',
                         return_value={'provider_location': 'loc',
                                       'provider_auth': 'CHAP u p'})
        self.source.move.side_effect = exception.InvalidVolume(
            reason='snapshots')
        remove = self.mock_object(self.drv, 'remove_export')
        self.assertRaises(exception.InvalidVolume, self.drv.migrate_volume,
                          self.ctxt, self.volume, self._dest())
        remove.assert_called_once_with(self.ctxt, self.volume)
        self.assertIsNone(self.volume.provider_location)
        self.assertIsNone(self.volume.provider_auth)
        self.assertEqual(2, self.volume.save.call_count)

    def test_failed_migrate_keeps_an_export_in_use(self):
        # Source.drop_migration_export keeps it, under the volume's lock:
        # a move still recorded from here (its commit landed although its
        # answer was lost, or its give-up waits for the database), or an
        # iSCSI attach from another node made while the migration started.
        self.volume.host = 'node-a@dmclone#dmclone'
        self.mock_object(self.volume, 'save')
        self.mock_object(self.drv, 'create_export',
                         return_value={'provider_location': 'loc',
                                       'provider_auth': 'CHAP u p'})
        self.source.move.side_effect = exception.VolumeBackendAPIException(
            data='lost answer')
        self.source.drop_migration_export.side_effect = None
        self.source.drop_migration_export.return_value = 'in use'
        remove = self.mock_object(self.drv, 'remove_export')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.migrate_volume, self.ctxt, self.volume,
                          self._dest())
        self.source.drop_migration_export.assert_called_once_with(
            self.volume, {'host': 'node-b',
                          'initiator': REMOTE['initiator']}, mock.ANY)
        remove.assert_not_called()
        self.assertEqual('loc', self.volume.provider_location)

    def test_a_move_left_undone_with_an_export_in_use_is_refused(self):
        # Not handed to Cinder's generic copy while another node reaches
        # the volume through its export here.
        self.volume.host = 'node-a@dmclone#dmclone'
        self.mock_object(self.volume, 'save')
        self.mock_object(self.drv, 'create_export',
                         return_value={'provider_location': 'loc',
                                       'provider_auth': 'CHAP u p'})
        self.source.move.return_value = None
        self.source.drop_migration_export.side_effect = None
        self.source.drop_migration_export.return_value = (
            'its export admits iqn.c')
        exc = self.assertRaises(dmc_exception.VolumeNotMovable,
                                self.drv.migrate_volume, self.ctxt,
                                self.volume, self._dest())
        self.assertIn('its export admits iqn.c', str(exc))
        self.assertEqual('loc', self.volume.provider_location)
        self.source.attach_done.assert_called_once_with(
            self.volume, {'host': 'node-b',
                          'initiator': REMOTE['initiator']})

    def test_a_failing_clean_up_keeps_the_migration_error(self):
        self.volume.host = 'node-a@dmclone#dmclone'
        self.mock_object(self.volume, 'save')
        self.mock_object(self.drv, 'create_export', return_value={})
        self.source.move.side_effect = exception.InvalidVolume(reason='x')
        self.mock_object(self.drv, 'remove_export',
                         side_effect=exception.ISCSITargetRemoveFailed(
                             volume_id=self.volume.id))
        self.assertRaises(exception.InvalidVolume, self.drv.migrate_volume,
                          self.ctxt, self.volume, self._dest())

    @ddt.data({}, dict(host='node-b@other#other'),
              dict(dmclone_initiator=None), dict(attached=True))
    def test_migrate_of_a_moving_volume_is_refused(self, case):
        # Before any fallback to Cinder's generic copy: that would give
        # the volume a new _name_id (its LV another name) mid-move.
        self.volume.host = 'node-a@dmclone#dmclone'
        case = dict(case)
        dest = self._dest()
        if 'host' in case:
            dest['host'] = case.pop('host')
        if case.pop('attached', False):
            self.volume.volume_attachment = objects.VolumeAttachmentList(
                objects=[objects.VolumeAttachment(id=fake.ATTACHMENT_ID)])
        dest['capabilities'].update(case)
        self.source.refuse_if_moving.side_effect = moving()
        export = self.mock_object(self.drv, 'create_export')
        self.assertRaises(move.MoveInProgress, self.drv.migrate_volume,
                          self.ctxt, self.volume, dest)
        self.source.end_stale_prepare.assert_called_once_with(self.volume)
        export.assert_not_called()
        self.source.move.assert_not_called()

    def test_in_use_volume_is_left_to_cinder(self):
        # (Cinder's manager does not even ask: Nova copies an attached
        # volume.  Asked anyway, the driver answers as the manager would.)
        self.volume.host = 'node-a@dmclone#dmclone'
        self.volume.volume_attachment = objects.VolumeAttachmentList(
            objects=[objects.VolumeAttachment(id=fake.ATTACHMENT_ID)])
        export = self.mock_object(self.drv, 'create_export')
        self.assertEqual((False, None), self.drv.migrate_volume(
            self.ctxt, self.volume, self._dest()))
        self.source.refuse_if_moving.assert_called_once_with(
            self.volume, 'a migration to node-b@dmclone#dmclone')
        export.assert_not_called()

    @ddt.data(dict(dmclone_node=None), dict(dmclone_initiator=None),
              dict(dmclone_initiator=''), dict(dmclone_node='node-a'),
              dict(dmclone_node='node-a.example.org'),
              dict(host='node-b@other#other'),
              dict(host='node-c@dmclone#dmclone'),
              dict(host='node-b@dmclone#other'), dict(attached=True))
    def test_migrate_elsewhere_is_generic(self, case):
        # Another backend, a node of this one that publishes no
        # initiator, this very node (or its alias), a pool that is not
        # the named node's: Cinder's generic copy.  (Cinder never asks
        # for a volume with attachments.)
        self.drv = self._make_driver(
            dmclone_node_aliases=['node-a.example.org'])
        self.drv._moves = self.moves
        self.volume.host = 'node-a@dmclone#dmclone'
        case = dict(case)
        dest = self._dest()
        if 'host' in case:
            dest['host'] = case.pop('host')
        if case.pop('attached', False):
            self.volume.volume_attachment = objects.VolumeAttachmentList(
                objects=[objects.VolumeAttachment(id=fake.ATTACHMENT_ID)])
        dest['capabilities'].update(case)
        export = self.mock_object(self.drv, 'create_export')
        self.assertEqual((False, None), self.drv.migrate_volume(
            self.ctxt, self.volume, dest))
        export.assert_not_called()
        self.source.move.assert_not_called()

    def test_sides_are_the_move_services(self):
        self.assertIs(self.moves, self.drv.moves)
        self.assertIs(self.source, self.drv.source)
        self.assertIs(self.destination, self.drv.destination)

    # -- node-to-node steps: one door, the endpoint ------------------------

    def test_prepare_step_returns_local_connection(self):
        self.endpoint.receive.return_value = HANDLE_PATH
        connector = dict(REMOTE, dmclone=STEP)
        info = self.drv.initialize_connection(self.volume, connector)
        # Only a prepare comes by initialize_connection.
        self.endpoint.receive.assert_called_once_with(
            self.volume, connector, STEP, peer.BY_INITIALIZE)
        self.assertEqual({'driver_volume_type': 'local',
                          'data': {'device_path': HANDLE_PATH,
                                   'volume_id': self.volume.id,
                                   'access_mode': 'rw'}}, info)
        self.source.wants_move.assert_not_called()
        self.source.move.assert_not_called()
        self.source.refuse_if_moving.assert_not_called()

    def test_prepare_step_exports_nothing(self):
        target = self.mock_object(self.drv.target_driver, 'create_export')
        connector = dict(REMOTE, dmclone=STEP)
        self.assertEqual({}, self.drv.create_export(
            self.ctxt, self.volume, connector))
        # Checked (not run) before the manager goes on to the connection.
        self.endpoint.check.assert_called_once_with(self.volume, STEP,
                                                    peer.BY_INITIALIZE)
        self.endpoint.receive.assert_not_called()
        target.assert_not_called()
        self.assertEqual({}, self.dm.devices)

    def test_forged_step_is_refused_at_the_export(self):
        self.endpoint.check.side_effect = dmc_exception.StepRefused(
            op='prepare', volume=self.volume.id, reason='no secret')
        target = self.mock_object(self.drv.target_driver, 'create_export')
        self.assertRaises(dmc_exception.StepRefused, self.drv.create_export,
                          self.ctxt, self.volume, dict(REMOTE, dmclone=STEP))
        target.assert_not_called()
        self.assertEqual({}, self.dm.devices)

    def test_forged_step_is_refused_at_the_connection(self):
        self.endpoint.receive.side_effect = dmc_exception.StepRefused(
            op='prepare', volume=self.volume.id, reason='no secret')
        self.assertRaises(dmc_exception.StepRefused,
                          self.drv.initialize_connection, self.volume,
                          dict(REMOTE, dmclone=STEP))
        self.source.wants_move.assert_not_called()
        self.assertEqual({}, self.dm.devices)

    def test_terminate_with_step_serves_it(self):
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        connector = dict(REMOTE, dmclone={'op': 'retire'})
        self.assertFalse(self.drv.terminate_connection(self.volume,
                                                       connector))
        # Only release, retire and abort come by terminate_connection.
        self.endpoint.receive.assert_called_once_with(
            self.volume, connector, {'op': 'retire'}, peer.BY_TERMINATE)
        self.destination.detached.assert_not_called()
        self.source.finish_rollback.assert_not_called()
        target.assert_not_called()

    # -- attaches ----------------------------------------------------------

    def test_remote_instance_attach_moves(self):
        self.source.wants_move.return_value = True
        self.source.move.return_value = {'driver_volume_type': 'local'}
        self.dm.sizes[LV_PATH] = 4194304
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual({'driver_volume_type': 'local'}, info)
        self.source.wants_move.assert_called_once_with(self.volume, REMOTE)
        self.source.move.assert_called_once_with(self.volume, REMOTE,
                                                 mock.ANY)
        self.dm.sizes[LV_PATH] = 8388608    # an extend before the lock
        self.assertEqual(8388608, self.source.move.call_args[0][2]())
        self.endpoint.receive.assert_not_called()

    def test_failed_move_leaves_a_user_message(self):
        self.source.wants_move.return_value = True
        self.source.move.side_effect = exception.VolumeBackendAPIException(
            data='destination full')
        self.dm.sizes[LV_PATH] = 4194304
        create = self.mock_object(message_api.API, 'create')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.initialize_connection, self.volume, REMOTE)
        create.assert_called_once_with(
            mock.ANY, message_field.Action.UPDATE_ATTACHMENT,
            resource_uuid=self.volume.id,
            detail=message_field.Detail.ATTACH_ERROR)
        # For the volume's project, so that its users can list it.
        self.assertEqual(self.volume.project_id,
                         create.call_args[0][0].project_id)

    def test_user_message_failure_keeps_the_real_error(self):
        self.source.wants_move.return_value = True
        self.source.move.side_effect = exception.VolumeBackendAPIException(
            data='destination full')
        self.dm.sizes[LV_PATH] = 4194304
        self.mock_object(message_api.API, 'create',
                         side_effect=RuntimeError('db down'))
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.initialize_connection, self.volume,
                                REMOTE)
        self.assertIn('destination full', str(exc))

    def test_move_without_service_falls_back_to_iscsi(self):
        self.source.wants_move.return_value = True
        self.source.move.return_value = None
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.source.move.assert_called_once()

    def test_remote_attach_without_move_is_iscsi(self):
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.source.wants_move.assert_called_once_with(self.volume, REMOTE)
        self.source.move.assert_not_called()
        # Under the volume's lock, never while a move is recorded.
        self.source.connect_over_iscsi.assert_called_once_with(
            self.volume, REMOTE, mock.ANY)

    def test_local_attach_never_moves(self):
        self.drv.initialize_connection(self.volume, LOCAL)
        self.source.wants_move.assert_not_called()
        self.source.move.assert_not_called()
        self.endpoint.receive.assert_not_called()

    def test_local_attach_waits_for_and_refuses_a_move(self):
        # On the source, while a move is being prepared: the attach waits
        # for the lock and is refused, so hydration never runs under a
        # writer here.  (Before: no check at all.)
        self.source.refuse_local_attach.side_effect = moving()
        self.assertRaises(move.MoveInProgress,
                          self.drv.initialize_connection, self.volume, LOCAL)
        self.source.refuse_local_attach.assert_called_once_with(
            self.volume, 'attaching it here')
        self.assertEqual({}, self.dm.devices)

    def test_remote_export_is_refused_while_moving(self):
        self.source.refuse_if_moving.side_effect = moving()
        target = self.mock_object(self.drv.target_driver, 'create_export')
        self.assertRaises(move.MoveInProgress, self.drv.create_export,
                          self.ctxt, self.volume, REMOTE)
        self.source.refuse_if_moving.assert_called_once_with(
            self.volume, 'attaching on node-b')
        target.assert_not_called()

    def test_remote_export_ends_a_dead_prepare_first(self):
        # (Left by an attempt that could not record its outcome: see
        # test_control_plane.)
        calls = self.source.mock_calls
        self.mock_object(self.drv.target_driver, 'create_export',
                         return_value={'location': 'loc', 'auth': None})
        self.drv.create_export(self.ctxt, self.volume, REMOTE)
        self.assertEqual(
            [mock.call.end_stale_prepare(self.volume),
             mock.call.refuse_if_moving(self.volume, 'attaching on node-b')],
            [c for c in calls if c[0] in ('end_stale_prepare',
                                          'refuse_if_moving')])

    def test_local_export_does_not_ask(self):
        self.assertEqual({}, self.drv.create_export(self.ctxt, self.volume,
                                                    LOCAL))
        self.source.refuse_if_moving.assert_not_called()
        self.endpoint.check.assert_not_called()

    # -- detaches ----------------------------------------------------------

    def test_terminate_handled_by_the_move(self):
        self.destination.detached.return_value = True
        order = mock.Mock()
        order.attach_mock(self.source.finish_rollback, 'finish_rollback')
        order.attach_mock(self.destination.detached, 'detached')
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        self.assertFalse(self.drv.terminate_connection(self.volume, REMOTE))
        # A rollback its destination cut short is finished first.
        self.assertEqual([mock.call.finish_rollback(self.volume),
                          mock.call.detached(self.volume, REMOTE)],
                         order.mock_calls)
        target.assert_not_called()

    def test_terminate_not_handled_goes_on(self):
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        self.drv.terminate_connection(self.volume, REMOTE)
        self.source.finish_rollback.assert_called_once_with(self.volume)
        self.destination.detached.assert_called_once_with(self.volume,
                                                          REMOTE)
        target.assert_called_once_with(self.volume, REMOTE)

    def test_terminate_keeps_the_acl_a_move_from_here_reads(self):
        # (A detach of the destination's attachment, routed here by an
        # older read of the record: Source.keeps_acl.)
        self.source.keeps_acl.return_value = True
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        self.assertFalse(self.drv.terminate_connection(self.volume, REMOTE))
        self.source.keeps_acl.assert_called_once_with(self.volume, REMOTE)
        target.assert_not_called()

    def test_remove_export_skipped_during_transfer(self):
        self.source.keeps_export.return_value = True
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_not_called()
        self.source.keeps_export.assert_called_once_with(self.volume)

    def test_remove_export_when_not_the_source(self):
        self.source.keeps_export.return_value = False
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_called_once_with(self.ctxt, self.volume)

    # -- extend, delete, retype, stats -------------------------------------

    def test_the_lv_grows_in_the_critical_section_of_the_check(self):
        # Review 4, finding 7: the move was checked under the volume's
        # lock, the lock released, then the LV grown and the move read
        # again: abandon-source (or any step) could take the lock in
        # between.  Now one critical section: check, LV, table.
        events = []
        lock = mock.MagicMock()
        lock.__enter__.side_effect = lambda: events.append('lock')
        lock.__exit__.side_effect = lambda *exc: events.append('unlock')
        self.mock_object(move, 'lock', return_value=lock)
        self.vg.extend_volume.side_effect = (
            lambda *a: events.append('lvextend'))
        real = destination.Destination(
            {'node-a'}, 'node-a', mock.Mock(), mock.Mock(), mock.Mock(),
            mock.Mock())
        real.store.load.side_effect = lambda ctxt, vid: events.append(
            'read the move')
        self.moves.destination = real
        self.drv.extend_volume(self.volume, 2)
        self.assertEqual(['lock', 'read the move', 'lvextend', 'unlock'],
                         events)

    def test_extend_during_transfer(self):
        def extend(volume, grow):
            grow()
            return True
        self.destination.extend.side_effect = extend
        self.dm.devices[HANDLE] = [dmsetup.linear_segment(0, 1024, LV_PATH)]
        target = self.mock_object(self.drv.target_driver, 'extend_target')
        self.drv.extend_volume(self.volume, 2)
        self.vg.extend_volume.assert_called_once_with(LV, '2g')
        self.destination.extend.assert_called_once_with(self.volume,
                                                        mock.ANY)
        # The destination owns the table: the handle is not refreshed here.
        self.assertEqual(1024, dmsetup.table_length(self.dm.devices[HANDLE]))
        target.assert_called_once_with(self.volume)

    def test_extend_refused_before_the_lv_grows(self):
        self.destination.extend.side_effect = moving()
        self.assertRaises(move.MoveInProgress,
                          self.drv.extend_volume, self.volume, 2)
        self.vg.extend_volume.assert_not_called()

    def test_delete_during_transfer(self):
        self.destination.delete.return_value = True
        self._make_handle()
        self.drv.delete_volume(self.volume)
        self.destination.delete.assert_called_once_with(self.volume)
        self.source.give_up_aborted.assert_not_called()
        self.vg.delete.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_delete_without_transfer(self):
        self._make_handle()
        order = mock.Mock()
        order.attach_mock(self.destination.delete, 'delete')
        order.attach_mock(self.source.give_up_aborted, 'give_up_aborted')
        order.attach_mock(self.vg.delete, 'lv_delete')
        self.drv.delete_volume(self.volume)
        # An aborted move of the volume is ended before its LV goes.
        self.assertEqual([mock.call.delete(self.volume),
                          mock.call.give_up_aborted(self.volume),
                          mock.call.lv_delete(LV)], order.mock_calls)
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_retype_retunes(self):
        new_type = {'extra_specs': {'dmclone:hydration_threshold': '8'}}
        self.assertTrue(self.drv.retype(self.ctxt, self.volume, new_type,
                                        {}, 'node-a@dmclone'))
        self.destination.retune.assert_called_once_with(self.volume,
                                                        new_type)

    def test_progress_in_the_stats_comes_from_the_tracker(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        report = {'vol': {'percent': '42.0', 'state': 'hydrating'}}
        self.tracker.progress_report.return_value = report
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(report, pool['dmclone_transfers'])
        self.tracker.progress_report.assert_called_once_with()

    # -- service start -------------------------------------------------------

    def test_recovery_at_start(self):
        here = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME_ID)
        self.mock_object(objects.VolumeList, 'get_all_by_host',
                         return_value=[here])
        self.drv.metadata_vg = self.vg
        self.drv._recover_transfers()
        self.recovery.recover.assert_called_once_with([here], [])

    def test_monitor_at_start(self):
        self.drv._start_monitor()
        self.assertIs(self.moves.monitor, self.drv.monitor)
        self.moves.monitor.start.assert_called_once_with()


class ExportMovingAwayTestCase(test_driver.DriverTestBase):
    """After a reboot of a move's source: its export, restored."""

    def setUp(self):
        super().setUp()
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            source='node-a', dest='node-b')
        # The record names node-b; the export is still node-a's.
        self.volume.host = 'node-b@dmclone#dmclone'
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        location = '10.0.0.1:3260,1 iqn.x:%s 0'
        self.other = fake_volume.fake_volume_obj(self.ctxt,
                                                 id=fake.VOLUME2_ID)
        self.other.provider_location = location % self.other.name
        self.lvs[self.other.name] = '1.00'
        self.mock_object(objects.VolumeList, 'get_all_by_host',
                         return_value=[self.other])
        self.get_all = self.mock_object(
            objects.VolumeList, 'get_all',
            side_effect=lambda ctxt, filters: [self.volume] if filters[
                'metadata'] == {'dmclone_source_node': 'node-a'} else [])

    def test_every_handle_before_lio_restores_its_targets(self):
        handles = []
        target = self.mock_object(
            self.drv.target_driver, 'ensure_export',
            side_effect=lambda *a: handles.append(sorted(self.dm.devices)))
        self.drv._ensure_export_moving_away(self.volume)
        other_handle = 'dmclone-dmc--vg-' + self.other.name
        self.assertEqual([sorted([HANDLE, other_handle])], handles)
        target.assert_called_once_with(mock.ANY, self.volume, HANDLE_PATH)

    def devices_at_the_first_export(self):
        """Start with another volume's ensure_export; the devices LIO saw."""
        handles = []
        self.mock_object(
            self.drv.target_driver, 'ensure_export',
            side_effect=lambda *a: handles.append(sorted(self.dm.devices)))
        self.drv.ensure_export(self.ctxt, self.other)
        return handles[0]

    def test_a_start_with_an_in_use_volume_rebuilds_it_too(self):
        # Cinder's own ensure_export of another volume comes first: LIO
        # restores every saved target then, the moving one's included.
        self.assertIn(HANDLE, self.devices_at_the_first_export())

    def test_a_bad_record_costs_only_its_own_volume(self):
        # (Review of b82e818: one malformed record of a volume moving away
        # made every in-use volume's ensure_export fail at start.)
        bad = transfer_metadata(source='node-a', dest='node-b')
        bad['dmclone_target_portal'] = 'not a portal'
        self.db.volume_admin_metadata_get.side_effect = (
            lambda ctxt, vid: bad if vid == self.volume.id else {})
        target = self.mock_object(self.drv.target_driver, 'ensure_export')
        self.drv.ensure_export(self.ctxt, self.other)
        target.assert_called_once()
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_a_volume_deleted_meanwhile_is_skipped(self):
        # Cinder's metadata filter matches user metadata too: an owner's
        # volume named by it, deleted during the start, costs nothing.
        def gone(ctxt, vid):
            if vid == self.volume.id:
                raise exception.VolumeNotFound(volume_id=vid)
            return {}
        self.db.volume_admin_metadata_get.side_effect = gone
        target = self.mock_object(self.drv.target_driver, 'ensure_export')
        self.drv.ensure_export(self.ctxt, self.other)
        target.assert_called_once()

    def test_a_move_that_never_went_ahead_is_not_exported_again(self):
        # (Its record still names node-a: Cinder's start exports it if
        # it is node-a's to export.)
        self.volume.host = 'node-a@dmclone#dmclone'
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            state=move.PREPARING, source='node-a', dest='node-b')
        self.mock_object(self.drv.target_driver, 'ensure_export')
        self.drv.ensure_export(self.ctxt, self.other)
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_a_move_set_back_to_preparing_is_exported_again(self):
        # The record names node-b: the move was committed, then set back
        # by a stale whole save (R14-4); node-b still reads from here.
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            state=move.PREPARING, source='node-a', dest='node-b')
        self.assertIn(HANDLE, self.devices_at_the_first_export())


class RefuseDuringTransferTestCase(test_driver.DriverTestBase):
    """The real Mover over the driver's Store: operations that must wait."""

    def setUp(self):
        super().setUp()
        self.db.volume_admin_metadata_get.return_value = dict(
            transfer_metadata(), dmclone_percent='37.5')

    def _check(self, exc, action):
        self.assertIn(action, str(exc))
        self.assertIn('node-b to node-a', str(exc))
        self.assertIn('37.5%', str(exc))

    def test_create_snapshot(self):
        exc = self.assertRaises(move.MoveInProgress,
                                self.drv.create_snapshot, self._snapshot())
        self._check(exc, 'a snapshot')
        self.vg.create_lv_snapshot.assert_not_called()

    def test_lvm_temporary_snapshot_is_allowed(self):
        # The LVM driver snapshots a clone source with a plain dict.
        self.drv.create_snapshot({'name': 'clone-snap-x', 'volume_name': LV,
                                  'volume_size': 1, 'id': 'x'})
        self.vg.create_lv_snapshot.assert_called_once()

    def test_create_cloned_volume(self):
        src = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME_ID)
        clone = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME2_ID)
        exc = self.assertRaises(move.MoveInProgress,
                                self.drv.create_cloned_volume, clone, src)
        self._check(exc, 'cloning it')
        self.vg.create_volume.assert_not_called()

    def test_revert_to_snapshot(self):
        self._make_handle()
        exc = self.assertRaises(move.MoveInProgress,
                                self.drv.revert_to_snapshot, self.ctxt,
                                self.volume, self._snapshot())
        self._check(exc, 'a revert to a snapshot')
        self.assertIn(HANDLE, self.dm.devices)
        self.vg.revert.assert_not_called()

    def test_unmanage(self):
        # Unmanaging a volume in the middle of a move would drop the clone
        # (the only handle that reads the regions not yet copied) and
        # leave Cinder's record without the source's export it needs.
        self._make_handle()
        exc = self.assertRaises(move.MoveInProgress,
                                self.drv.unmanage, self.volume)
        self._check(exc, 'unmanaging it')
        self.assertIn(HANDLE, self.dm.devices)

    def test_remove_export_is_skipped_on_the_source(self):
        # The source's export feeds the clone until the transfer ends.
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            source='node-a', dest='node-b')
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_not_called()

    def test_remove_export_on_the_destination_keeps_the_sources(self):
        # The record still names the source's export: not ours to remove.
        self.volume.provider_location = '10.0.0.2:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_not_called()

    def test_no_remote_export_while_moving(self):
        # An export to a third node would hold the clone open and outlive
        # a rollback: refused before anything is exported.
        target = self.mock_object(self.drv.target_driver, 'create_export')
        exc = self.assertRaises(
            move.MoveInProgress, self.drv.create_export, self.ctxt,
            self.volume, {'host': 'node-c', 'initiator': 'iqn.x:c'})
        self._check(exc, 'attaching on node-c')
        target.assert_not_called()
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_local_export_while_moving_is_fine(self):
        self._make_handle()
        self.assertEqual({}, self.drv.create_export(
            self.ctxt, self.volume, {'host': 'node-a'}))

    def test_invalid_state_refuses_too(self):
        self.db.volume_admin_metadata_get.return_value = dict(
            transfer_metadata(), dmclone_region_sectors='100')
        self.assertRaises(move.MoveStateInvalid,
                          self.drv.create_snapshot, self._snapshot())


class NoTransferTestCase(test_driver.DriverTestBase):

    def test_wants_move_only_for_instances(self):
        self.volume.volume_attachment = objects.VolumeAttachmentList(
            objects=[objects.VolumeAttachment(
                id=fake.ATTACHMENT_ID, instance_uuid=None,
                attach_status=fields.VolumeAttachStatus.RESERVED)])
        self.mock_object(objects.VolumeAttachmentList,
                         'get_all_by_volume_id',
                         return_value=self.volume.volume_attachment)
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        move_ = self.mock_object(source.Source, 'move')
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        move_.assert_not_called()

    def test_extend_and_delete_without_transfer(self):
        self._make_handle()
        self.dm.sizes[LV_PATH] = 4194304
        self.drv.extend_volume(self.volume, 2)
        self.assertEqual(4194304,
                         dmsetup.table_length(self.dm.devices[HANDLE]))
        self.drv.delete_volume(self.volume)
        self.vg.delete.assert_called_once_with(LV)


@ddt.ddt
class WiringTestCase(test_driver.DriverTestBase):
    """The driver's MoveService: built once, from its configuration."""

    def test_moves(self):
        drv = self._make_driver(dmclone_node_aliases=['node-a.example.org'],
                                dmclone_region_size=256,
                                dmclone_stall_timeout=300)
        m = drv.moves
        self.assertIs(m, drv.moves)
        self.assertIs(m.source, drv.source)
        self.assertIs(m.destination, drv.destination)
        for side in (m.source, m.destination):
            self.assertEqual({'node-a', 'node-a.example.org'},
                             side.node_names)
            self.assertEqual('node-a', side.node_name)
            self.assertIs(drv.store, side.store)
            self.assertIs(drv.peer, side.peer)
        self.assertEqual(512, m.source.region_sectors)
        self.assertIs(drv.target_driver, m.source.target_driver)
        self.assertIs(drv.dm, m.source.dm)
        self.assertEqual(test_driver.VG, m.source.volume_group)
        self.assertIs(drv.wiper, m.source.wiper)
        # One door for the steps, over these very sides.
        self.assertIs(m.source, m.endpoint.source)
        self.assertIs(m.destination, m.endpoint.destination)
        self.assertIs(m.source, m.recovery.source)
        self.assertIs(m.destination, m.recovery.destination)
        self.assertIs(m.destination, m.tracker.destination)
        self.assertIs(m.recovery, m.tracker.recovery)
        self.assertEqual(300, m.tracker.stall_timeout)

    def test_peer_names_this_node(self):
        self.assertEqual('node-a', self.drv.peer.node_name)
        drv = self._make_driver(dmclone_node_name='compute-7',
                                dmclone_transfer_timeout=42)
        self.assertEqual('compute-7', drv.peer.node_name)
        self.assertEqual(42, drv.peer.timeout)

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_clones(self, mock_connector):
        self.drv.metadata_vg = mock.sentinel.meta_vg
        clones = self.drv.moves.destination.clones
        self.assertIs(clones, self.drv.moves.destination.clones)
        mock_connector.assert_called_once_with(
            'ISCSI', use_multipath=False, device_scan_attempts=mock.ANY)
        self.assertIs(mock_connector.return_value, clones.connector)
        self.assertIs(self.vg, clones.vg)
        self.assertIs(mock.sentinel.meta_vg, clones.meta_vg)
        self.assertIs(self.dm, clones.dm)
        self.assertEqual('default', clones.lvm_type)
        self.assertEqual(2.0, clones.metadata_reserve)

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_clones_of_a_thin_backend(self, mock_connector):
        # A move into a thin pool is checked against Cinder's pool and
        # the backend's over-subscription and reserve.
        drv = self._make_driver(lvm_type='thin',
                                max_over_subscription_ratio='auto',
                                reserved_percentage=5)
        drv.dm = self.dm
        clones = drv.moves.destination.clones
        self.assertEqual(('thin', 'dmc-vg-pool', 'auto', 5),
                         (clones.lvm_type, clones.thin_pool,
                          clones.max_over_subscription_ratio,
                          clones.reserved_percentage))

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_clones_share_the_vg(self, mock_connector):
        self.assertIs(self.vg, self.drv.moves.destination.clones.meta_vg)

    @mock.patch.object(brick_lvm, 'LVM')
    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_clones_built_at_setup_use_the_metadata_vg(self, mock_connector,
                                                       mock_lvm):
        # The MoveService is built at the first use, which at service start
        # comes after the metadata VG is opened.
        self.mock_object(cinder_lvm.LVMVolumeDriver, 'check_for_setup_error')
        self.mock_object(hydration.HydrationMonitor, 'start')
        self.drv.configuration.dmclone_metadata_volume_group = 'fast-vg'
        self.drv.check_for_setup_error()
        self.assertIs(mock_lvm.return_value,
                      self.drv.moves.destination.clones.meta_vg)

    @mock.patch.object(volume_utils, 'brick_get_connector_properties',
                       return_value={'host': 'node-a.example.org',
                                     'initiator': 'iqn.x'})
    def test_own_connector(self, mock_props):
        props = self.drv.peer.own_connector()
        self.assertEqual({'host': 'node-a', 'initiator': 'iqn.x'}, props)
        self.drv.peer.own_connector()
        mock_props.assert_called_once_with()

    def _retire(self):
        self.volume.host = 'node-b@dmclone#dmclone'
        self.mock_object(self.drv.target_driver, 'terminate_connection')
        self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.source.retire(self.volume, REMOTE)

    def test_retire(self):
        self._make_handle()
        self._retire()
        self.assertNotIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_called_once_with(LV)
        self.drv.target_driver.terminate_connection.assert_called_once_with(
            self.volume, REMOTE)
        self.drv.target_driver.remove_export.assert_called_once_with(
            mock.ANY, self.volume)
        self.lvs.clear()
        self._retire()
        self.vg.delete.assert_called_once_with(LV)

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_retire_on_an_unlisted_group_fails_keeping_the_copy(self, _c):
        # Brick's lookup says "no LV" for a volume group not found (a PV
        # not scanned yet after a reboot): the retire must fail, so that
        # the destination's finalization asks again, rather than succeed
        # and leave the old copy here unwiped for good (review 22).
        self._make_handle()
        self.vg.get_volume.side_effect = lambda name: None
        self.vg_lv_names.side_effect = processutils.ProcessExecutionError(
            stderr='Volume group "%s" not found' % test_driver.VG)
        self.assertRaises(dmc_exception.LVMUnlisted, self._retire)
        self.vg.delete.assert_not_called()
        self.vg.rename_volume.assert_not_called()
        self.assertIn(LV, self.lvs)

    def test_retire_refused_while_the_record_names_this_node(self):
        self._make_handle()
        self.volume.host = 'node-a@dmclone#dmclone'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.source.retire, self.volume, REMOTE)
        self.assertIn('still names this node', str(exc))
        self.assertIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_not_called()

    @mock.patch.object(volume_utils, 'clear_volume')
    def test_retire_wipes_the_old_copy(self, mock_clear):
        # The moved volume's extents go to the next thick LV here,
        # another tenant's perhaps.  (Before: removed without a wipe.)
        self.drv.configuration.volume_clear = 'zero'
        self.drv.configuration.volume_clear_size = 0
        self.drv.wiper._spawn = lambda fn, *args: fn(*args)
        self._make_handle()
        order = []
        mock_clear.side_effect = lambda *a, **k: order.append(('wipe', a[1]))
        self.vg.rename_volume.side_effect = lambda old, new: (
            order.append(('rename', old, new)),
            self.dm.sizes.__setitem__(
                '/dev/%s/%s' % (test_driver.VG, new), self.dm.sizes[LV_PATH]))
        self.vg.delete.side_effect = lambda name: order.append(
            ('delete', name))
        self._retire()
        self.assertNotIn(HANDLE, self.dm.devices)
        retiring = order[0][2]
        self.assertTrue(retiring.startswith(LV + '-dmcwipe-'))
        self.assertEqual([('rename', LV, retiring),
                          ('wipe', '/dev/%s/%s' % (test_driver.VG, retiring)),
                          ('delete', retiring)], order)
        mock_clear.assert_called_once_with(
            1024, mock.ANY, volume_clear='zero', volume_clear_size=0,
            volume_clear_ionice=self.drv.configuration.volume_clear_ionice)

    @ddt.data(dict(volume_clear='none'),
              dict(volume_clear='zero', lvm_type='thin'))
    @mock.patch.object(volume_utils, 'clear_volume')
    def test_no_wipe_when_not_needed(self, config, mock_clear):
        for key, value in config.items():
            setattr(self.drv.configuration, key, value)
        self.drv._wipe(LV_PATH, 1024)
        mock_clear.assert_not_called()

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_destination_wipes_with_the_driver(self, mock_connector):
        self.assertEqual(self.drv.wiper.discard,
                         self.drv.moves.destination.clones.discard)
        self.assertIs(self.drv.wiper, self.drv.wiper)
        self.assertIsNone(self.drv.wiper.wipe)      # volume_clear = none

    def test_monitor_wired_to_the_tracker(self):
        start = self.mock_object(hydration.HydrationMonitor, 'start')
        self.drv._start_monitor()
        monitor = self.drv.monitor
        self.assertIs(self.drv.moves.monitor, monitor)
        self.assertEqual(self.drv.moves.tracker.on_status,
                         monitor._on_status)
        # After each tick: the finalizations and rebuilds to try again.
        finalize = self.mock_object(self.drv.moves.destination,
                                    'finalize_pending')
        rebuild = self.mock_object(self.drv.moves.recovery,
                                   'retry_rebuilds')
        monitor._after_tick()
        finalize.assert_called_once_with()
        rebuild.assert_called_once_with()
        self.assertEqual(test_driver.VG, monitor._volume_group)
        self.assertIs(self.dm, monitor._dm)
        self.assertEqual(
            self.drv.configuration.dmclone_monitor_interval,
            monitor._interval)
        start.assert_called_once_with()

    # -- hydration tuning: the configuration's defaults ------------------

    @ddt.data(None, {}, {'extra_specs': None}, {'extra_specs': {}},
              {'extra_specs': {'other': 'x'}})
    def test_tuning_defaults_from_config(self, volume_type):
        self.assertEqual((64, 16),
                         self.drv.moves.destination.tuning(volume_type))

    def test_tuning_from_config(self):
        drv = self._make_driver(dmclone_hydration_threshold=8,
                                dmclone_hydration_batch_size=4)
        self.assertEqual((8, 4), drv.moves.destination.tuning(None))
        self.assertEqual((8, 2), drv.moves.destination.tuning(
            {'extra_specs': {'dmclone:hydration_batch_size': '2'}}))

    # -- recovery ------------------------------------------------------------

    def test_recover_without_db(self):
        self.drv.db = None
        recover = self.mock_object(recovery.Recovery, 'recover')
        self.drv._recover_transfers()
        recover.assert_not_called()

    def test_recover_collects_volumes(self):
        # Found by their move records, never by the names of the LVs
        # here.  (Before: a metadata LV's name was taken for its volume's
        # id, which misses a volume with a _name_id.)
        drv = self._make_driver(dmclone_node_aliases=['node-a.example.org'])
        here = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME_ID)
        moving_in = fake_volume.fake_volume_obj(self.ctxt,
                                                id=fake.VOLUME2_ID)
        moving_out = fake_volume.fake_volume_obj(self.ctxt,
                                                 id=fake.VOLUME3_ID)
        drv.metadata_vg = mock.Mock()
        drv.metadata_vg.get_volumes.return_value = [
            {'name': 'volume-%s-dmcmeta' % fake.VOLUME2_ID},
            {'name': 'volume-%s-dmcmeta' % fake.VOLUME4_ID},
            {'name': 'legacy-dmcmeta'},
            {'name': 'volume-%s' % fake.VOLUME4_ID}]
        by_host = self.mock_object(objects.VolumeList, 'get_all_by_host',
                                   return_value=[here])
        found = {('dmclone_dest_node', 'node-a.example.org'): [moving_in],
                 ('dmclone_dest_node', 'node-a'): [here],
                 ('dmclone_source_node', 'node-a'): [moving_out, here]}

        def get_all(ctxt, filters):
            (key, name), = filters['metadata'].items()
            return found.get((key, name), [])
        get_all = self.mock_object(objects.VolumeList, 'get_all',
                                   side_effect=get_all)
        get = self.mock_object(objects.Volume, 'get_by_id')
        recover = self.mock_object(recovery.Recovery, 'recover')
        drv._recover_transfers()
        by_host.assert_called_once_with(mock.ANY, 'node-a@dmclone#dmclone')
        # Every name of the node, as destination and as source.
        self.assertEqual(
            [('dmclone_dest_node', 'node-a'),
             ('dmclone_dest_node', 'node-a.example.org'),
             ('dmclone_source_node', 'node-a'),
             ('dmclone_source_node', 'node-a.example.org'),
             # (old copies of moves abandoned as lost: reported)
             ('dmclone_lost_source', 'node-a'),
             ('dmclone_lost_source', 'node-a.example.org')],
            [tuple(c.kwargs['filters']['metadata'].items())[0]
             for c in get_all.call_args_list])
        get.assert_not_called()
        # Each volume once, those of this host first.
        recover.assert_called_once_with(
            [here, moving_in, moving_out],
            ['volume-%s-dmcmeta' % fake.VOLUME2_ID,
             'volume-%s-dmcmeta' % fake.VOLUME4_ID,
             'legacy-dmcmeta'])

    # -- handles -------------------------------------------------------------

    def test_no_linear_handle_over_a_clone_in_progress(self):
        self.lvs[LV + '-dmcmeta'] = '0.01'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv._ensure_handle, self.volume)
        self.assertIn('being hydrated by a transfer', str(exc))
        self.assertNotIn('create', [c[0] for c in self.dm.calls])
        self.assertEqual({}, self.dm.devices)

    def metadata_vg_lists(self, names):
        """A metadata group of its own, whose LVM listing is ``names``.

        (An exception: LVM cannot list it.)
        """
        self.drv.metadata_vg = mock.Mock(vg_name='fast-meta')

        def vg_lv_names(vg, **kwargs):
            if vg != 'fast-meta':
                return frozenset(self.lvs)
            if isinstance(names, Exception):
                raise names
            return frozenset(names)
        self.vg_lv_names.side_effect = vg_lv_names

    def test_no_linear_handle_with_metadata_in_its_own_vg(self):
        self.metadata_vg_lists([LV + '-dmcmeta'])
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.ensure_export, self.ctxt, self.volume)
        # (LVM's own listing of that group, never brick's lookup.)
        self.assertIn('fast-meta', [c.args[0] for c in
                                    self.vg_lv_names.call_args_list])
        self.drv.metadata_vg.get_volume.assert_not_called()
        self.assertEqual({}, self.dm.devices)

    def test_no_linear_handle_while_the_metadata_vg_is_unlisted(self):
        # Brick's lookup read 'Volume group "fast-meta" not found' (its
        # PV scanned late after a reboot) as "no metadata LV": a partly
        # copied LV mapped linear.  Whether it is cannot be told now.
        self.metadata_vg_lists(dmc_exception.PrivilegedCommandFailed(
            command='lvs', reason='Volume group "fast-meta" not found'))
        exc = self.assertRaises(dmc_exception.StepUnlisted,
                                self.drv.ensure_export, self.ctxt,
                                self.volume)
        for text in ('Volume %s: mapping its LV %s alone is refused on '
                     'node node-a' % (self.volume.id, LV),
                     'cannot list volume group fast-meta',
                     "'vgs fast-meta' on node-a"):
            self.assertIn(text, str(exc))
        self.assertEqual({}, self.dm.devices)

    def test_linear_handle_once_the_metadata_vg_is_listed(self):
        self.metadata_vg_lists(['volume-other-dmcmeta'])
        self.drv.ensure_export(self.ctxt, self.volume)
        self.assertIn(HANDLE, self.dm.devices)

    def test_start_keeps_a_volume_whose_rebuild_waits_for_its_source(self):
        # Review R2 of 2026-11-25: both nodes lost power and this one's
        # service started first.  Recovery could not rebuild the clone;
        # ensure_export then failed and Cinder set the in-use volume to
        # error, which stayed after the monitor's retry rebuilt it.  Now
        # the start leaves it in-use: no handle, a warning; a local
        # attach is refused until the clone is back.
        self.lvs[LV + '-dmcmeta'] = '0.01'
        self.drv.moves.recovery.pending_rebuild[self.volume.id] = (
            mock.sentinel.move)
        log = self.mock_object(driver, 'LOG')
        self.assertIsNone(self.drv.ensure_export(self.ctxt, self.volume))
        self.assertEqual({}, self.dm.devices)
        self.assertIn('source node', log.warning.call_args[0][0])
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv._ensure_handle, self.volume)
        self.assertIn('its source node', str(exc))

    @ddt.data(move.PREPARING, move.CLONED, move.HYDRATING)
    def test_no_linear_handle_while_moving_in_without_metadata(self, state):
        # The record says the volume is moving here and its LV holds only
        # what was copied so far: even with its metadata LV lost, a start
        # (ensure_export) must not map that LV alone.
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            state=state, dest='node-a', source='node-b')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.ensure_export, self.ctxt,
                                self.volume)
        self.assertIn('being hydrated by a transfer', str(exc))
        self.assertEqual({}, self.dm.devices)

    @ddt.data(
        # (Finalizing: hydration was complete; the swap may have happened.)
        (move.FINALIZING, 'node-a', 'node-b'),
        # Moving away from here: this node's LV is the complete source.
        (move.HYDRATING, 'node-b', 'node-a'),
        (move.CLONED, 'node-b', 'node-a'),
        (move.ABORTED, 'node-a', 'node-b'))
    @ddt.unpack
    def test_linear_handle_over_a_complete_lv(self, state, dest, source):
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            state=state, dest=dest, source=source)
        self.assertEqual(HANDLE_PATH, self.drv._ensure_handle(self.volume))
        self.assertEqual('linear', self.dm.devices[HANDLE][0].target)

    def test_existing_clone_handle_is_kept(self):
        self.lvs[LV + '-dmcmeta'] = '0.01'
        clone = [dmsetup.clone_segment(0, 2097152, '/dev/m', LV_PATH,
                                       '/dev/sdb', 128)]
        self.dm.devices[HANDLE] = clone
        self.assertEqual(HANDLE_PATH, self.drv._ensure_handle(self.volume))
        self.assertEqual(clone, self.dm.devices[HANDLE])


@ddt.ddt
class HydrationTuningTestCase(test.TestCase):
    """destination.hydration_tuning: extra specs over the given defaults."""

    @ddt.data(None, {}, {'extra_specs': None}, {'extra_specs': {}},
              {'extra_specs': {'other': 'x'}})
    def test_tuning_defaults(self, volume_type):
        self.assertEqual((64, 16), destination.hydration_tuning(
            volume_type, threshold=64, batch_size=16))

    def test_tuning_of_other_defaults(self):
        self.assertEqual((8, 4), destination.hydration_tuning(
            None, threshold=8, batch_size=4))

    @ddt.data(({'dmclone:hydration_threshold': '128'}, (128, 16)),
              ({'dmclone:hydration_batch_size': '1'}, (64, 1)),
              ({'dmclone:hydration_threshold': 2,
                'dmclone:hydration_batch_size': '32'}, (2, 32)))
    @ddt.unpack
    def test_tuning_extra_specs(self, specs, expected):
        self.assertEqual(expected, destination.hydration_tuning(
            {'extra_specs': specs}, threshold=64, batch_size=16))

    @ddt.data('0', '-1', 'x', '1.5', '')
    def test_tuning_invalid(self, value):
        exc = self.assertRaises(
            exception.InvalidVolumeType, destination.hydration_tuning,
            {'extra_specs': {'dmclone:hydration_batch_size': value}},
            threshold=64, batch_size=16)
        self.assertIn('dmclone:hydration_batch_size=%r must be a positive '
                      'integer' % value, str(exc))
