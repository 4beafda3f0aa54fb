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

"""Node-to-node steps: sent over Cinder's volume RPC API, received by
the Endpoint."""

from unittest import mock

import ddt

from cinder import context
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_volume
from cinder.tests.unit import test
from cinder.volume import rpcapi as volume_rpcapi
from cinder.volume import volume_utils

from cinder_dmclone import destination
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import move
from cinder_dmclone import peer
from cinder_dmclone import source
from tests.unit import fakes

CONNECTOR = {'host': 'node-b', 'initiator': 'iqn.2024-01.org.example.b:i',
             'ip': '10.0.0.2'}


@ddt.ddt
class PayloadTestCase(test.TestCase):

    @ddt.data(None, {}, {'host': 'node-b'})
    def test_no_step(self, connector):
        self.assertIsNone(peer.payload(connector))

    @ddt.data({'dmclone': None}, {'dmclone': 'prepare'},
              {'dmclone': ['prepare']}, {'dmclone': {}},
              {'dmclone': {'op': 'reboot'}}, {'dmclone': {'op': None}})
    def test_malformed_step_is_still_a_step(self, connector):
        # Never an ordinary attach: a step no transfer accepts.
        self.assertEqual({'op': None}, peer.payload(connector))

    @ddt.data(*peer.OPS)
    def test_step(self, op):
        step = {'op': op, 'hydrate': True}
        self.assertEqual(step, peer.payload(dict(CONNECTOR, dmclone=step)))

    def test_ops(self):
        self.assertEqual(('prepare', 'release', 'retire', 'abort', 'closed',
                          'detached'), peer.OPS)


class PeerClientTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.volume = fake_volume.fake_volume_obj(
            self.ctxt, host='node-a@dmclone#dmclone', cluster_name='c1@dm',
            size=3)
        self.rpcapi = mock.Mock()
        self.client = peer.PeerClient(rpcapi=self.rpcapi)

    @mock.patch.object(volume_rpcapi, 'VolumeAPI')
    def test_rpcapi_is_created_lazily_once(self, mock_api):
        client = peer.PeerClient()
        mock_api.assert_not_called()
        self.assertIs(mock_api.return_value, client.rpcapi)
        self.assertIs(mock_api.return_value, client.rpcapi)
        mock_api.assert_called_once_with()

    @mock.patch.object(volume_rpcapi, 'VolumeAPI')
    def test_calls_are_bounded_by_the_transfer_timeout(self, mock_api):
        original = mock_api.return_value.client
        api = peer.PeerClient(timeout=42).rpcapi
        original.prepare.assert_called_once_with(timeout=42)
        self.assertIs(original.prepare.return_value, api.client)

    def test_given_rpcapi(self):
        self.assertIs(self.rpcapi, self.client.rpcapi)

    def test_routed_copy(self):
        routed = peer.PeerClient._at(self.volume, 'node-b@dmclone#dmclone')
        self.assertEqual('node-b@dmclone#dmclone', routed.host)
        self.assertIsNone(routed.cluster_name)
        self.assertEqual('node-b@dmclone#dmclone',
                         routed.service_topic_queue)
        self.assertEqual(self.volume.id, routed.id)
        # The caller's object is untouched.
        self.assertEqual('node-a@dmclone#dmclone', self.volume.host)
        self.assertEqual('c1@dm', self.volume.cluster_name)

    def test_prepare(self):
        connector = dict(CONNECTOR)
        info = self.client.prepare(self.ctxt, self.volume,
                                   'node-b@dmclone#dmclone', connector,
                                   'f' * 32, hydrate=False, size_gb=3)
        self.assertIs(self.rpcapi.initialize_connection.return_value, info)
        ctxt, routed, sent = self.rpcapi.initialize_connection.call_args.args
        self.assertIs(self.ctxt, ctxt)
        self.assertEqual('node-b@dmclone#dmclone', routed.host)
        step = {'op': 'prepare', 'hydrate': False, 'size_gb': 3,
                'secret': 'f' * 32}
        self.assertEqual(dict(CONNECTOR, dmclone=step), sent)
        self.assertEqual(CONNECTOR, connector)
        self.assertEqual(step, peer.payload(sent))

    def test_prepare_op_cannot_be_overridden(self):
        self.client.prepare(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                            CONNECTOR, 'f' * 32, op='retire')
        sent = self.rpcapi.initialize_connection.call_args.args[2]
        self.assertEqual('prepare', sent['dmclone']['op'])

    def test_prepare_errors_propagate(self):
        self.rpcapi.initialize_connection.side_effect = ValueError('x')
        self.assertRaises(ValueError, self.client.prepare, self.ctxt,
                          self.volume, 'node-b@dmclone#dmclone', CONNECTOR,
                          'f' * 32)

    def test_request(self):
        client = peer.PeerClient(rpcapi=self.rpcapi, node_name='node-a',
                                 connector=dict(CONNECTOR))
        for op in (peer.RELEASE, peer.RETIRE, peer.ABORT):
            self.assertIsNone(client.request(
                self.ctxt, self.volume, 'node-b@dmclone#dmclone', op,
                'f' * 32))
            ctxt, routed, sent = \
                self.rpcapi.terminate_connection.call_args.args
            self.assertIs(self.ctxt, ctxt)
            self.assertEqual('node-b@dmclone#dmclone', routed.host)
            self.assertEqual(dict(CONNECTOR, dmclone={
                'op': op, 'secret': 'f' * 32}), sent)
        # The client's own connector is not changed by the steps.
        self.assertEqual(CONNECTOR, client.own_connector())

    def test_a_deletes_retire_says_so(self):
        client = peer.PeerClient(rpcapi=self.rpcapi, connector={})
        client.request(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                       peer.RETIRE, 'f' * 32, deleting=True)
        sent = self.rpcapi.terminate_connection.call_args.args[2]
        self.assertEqual({'dmclone': {'op': 'retire', 'secret': 'f' * 32,
                                      'deleting': True}}, sent)

    def test_request_without_connector(self):
        # A node whose connector has nothing (os-brick found no initiator)
        # still sends the step alone.
        client = peer.PeerClient(rpcapi=self.rpcapi, connector={})
        client.request(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                       peer.ABORT, 'f' * 32)
        sent = self.rpcapi.terminate_connection.call_args.args[2]
        self.assertEqual({'dmclone': {'op': 'abort', 'secret': 'f' * 32}},
                         sent)

    @mock.patch.object(volume_utils, 'brick_get_connector_properties')
    def test_request_carries_this_nodes_connector(self, mock_props):
        # The source drops the ACL of the initiator named here.
        mock_props.return_value = {'host': 'node-a.example.org',
                                   'initiator': 'iqn.x:a'}
        client = peer.PeerClient(rpcapi=self.rpcapi, node_name='node-a')
        client.request(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                       peer.RELEASE, 'f' * 32)
        client.request(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                       peer.RETIRE, 'f' * 32)
        sent = self.rpcapi.terminate_connection.call_args.args[2]
        self.assertEqual({'host': 'node-a', 'initiator': 'iqn.x:a',
                          'dmclone': {'op': 'retire', 'secret': 'f' * 32}},
                         sent)
        mock_props.assert_called_once_with()

    @mock.patch.object(volume_utils, 'brick_get_connector_properties')
    def test_own_connector(self, mock_props):
        mock_props.return_value = {'host': 'node-a.example.org',
                                   'initiator': 'iqn.x'}
        client = peer.PeerClient(node_name='node-a')
        props = client.own_connector()
        # The node's name as connectors and services spell it, not the
        # host name os-brick found.
        self.assertEqual({'host': 'node-a', 'initiator': 'iqn.x'}, props)
        # Computed once, and a caller's change does not stick.
        props['dmclone'] = {'op': 'retire'}
        self.assertEqual({'host': 'node-a', 'initiator': 'iqn.x'},
                         client.own_connector())
        mock_props.assert_called_once_with()

    @mock.patch.object(volume_utils, 'brick_get_connector_properties')
    def test_given_own_connector(self, mock_props):
        client = peer.PeerClient(node_name='node-a', connector=CONNECTOR)
        self.assertEqual(CONNECTOR, client.own_connector())
        mock_props.assert_not_called()


class VolumeRPCRoutingTestCase(test.TestCase):
    """The steps reach the other node's service through Cinder's API."""

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.volume = fake_volume.fake_volume_obj(
            self.ctxt, host='node-a@dmclone#dmclone', cluster_name=None)
        self.api = volume_rpcapi.VolumeAPI()
        self.cctxt = mock.Mock()
        self.prepare = self.mock_object(self.api.client, 'prepare',
                                        return_value=self.cctxt)
        self.mock_object(self.api.client, 'can_send_version',
                         return_value=True)
        self.client = peer.PeerClient(rpcapi=self.api)

    def test_prepare_goes_to_destination_service(self):
        self.client.prepare(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                            CONNECTOR, 'f' * 32, hydrate=True, size_gb=1)
        kwargs = self.prepare.call_args.kwargs
        self.assertEqual('node-b', kwargs['server'])
        self.assertEqual('cinder-volume.node-b@dmclone', kwargs['topic'])
        args, kwargs = self.cctxt.call.call_args
        self.assertEqual((self.ctxt, 'initialize_connection'), args)
        self.assertEqual('node-b@dmclone#dmclone', kwargs['volume'].host)
        self.assertEqual({'op': 'prepare', 'hydrate': True, 'size_gb': 1,
                          'secret': 'f' * 32},
                         kwargs['connector']['dmclone'])

    def test_request_goes_to_named_service(self):
        self.client = peer.PeerClient(rpcapi=self.api, connector=CONNECTOR)
        self.client.request(self.ctxt, self.volume, 'node-c@dmclone#dmclone',
                            peer.RETIRE, 'f' * 32)
        self.assertEqual('node-c', self.prepare.call_args.kwargs['server'])
        args, kwargs = self.cctxt.call.call_args
        self.assertEqual((self.ctxt, 'terminate_connection'), args)
        self.assertEqual(self.volume.id, kwargs['volume_id'])
        self.assertEqual({'op': 'retire', 'secret': 'f' * 32},
                         kwargs['connector']['dmclone'])
        self.assertEqual(CONNECTOR['initiator'],
                         kwargs['connector']['initiator'])


class BoundedCallsTestCase(test.TestCase):
    """With a real RPC client, the timeout reaches every call context."""

    def test_call_context_has_the_transfer_timeout(self):
        client = peer.PeerClient(timeout=42)
        self.mock_object(volume_rpcapi.VolumeAPI, '_compat_ver',
                         return_value='3.0')
        cctxt = client.rpcapi._get_cctxt('node-b@dmclone')
        self.assertEqual(42, cctxt.timeout)

    def test_without_timeout_the_global_one_applies(self):
        client = peer.PeerClient()
        self.assertIsNone(client.rpcapi.client.timeout)


SECRET = 'ab' * 16
STEPS = {peer.PREPARE: ('destination', 'prepare'),
         peer.ABORT: ('destination', 'abort'),
         peer.RELEASE: ('source', 'release'),
         peer.RETIRE: ('source', 'retire'),
         peer.CLOSED: ('source', 'confirm_closed'),
         peer.DETACHED: ('destination', 'detached_at_source')}


@ddt.ddt
class EndpointTestCase(test.TestCase):
    """The one door of the steps: checked first, then routed to a side.

    Real sides over a move store, whose step methods are replaced: the
    check is the sides' own (Side.authenticate).
    """

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.db = fakes.FakeDB()
        self.db.volumes[fake.VOLUME_ID] = {}
        self.store = move.Store(self.db)
        self.volume = fake_volume.fake_volume_obj(self.ctxt,
                                                  id=fake.VOLUME_ID)
        self.t = move.Move(
            volume_id=fake.VOLUME_ID, lv_name=self.volume.name,
            state=move.PREPARING, source_host='node-a@dmclone#dmclone',
            dest_host='node-b@dmclone#dmclone', source_node='node-a',
            dest_node='node-b', region_sectors=128, clone_sectors=2097152,
            target_portal='10.0.0.1:3260',
            target_iqn='iqn.2010-10.org.openstack:%s' % self.volume.name,
            source_aliases=('node-a.example.org',), secret=SECRET)
        self.store.save(self.ctxt, self.t)
        # node-a is the move's source, node-b its destination.
        self.a = self._endpoint('node-a')
        self.b = self._endpoint('node-b')

    def _endpoint(self, node):
        src = source.Source({node}, node, self.store, mock.Mock(), None,
                            None, 'vg', None, 128)
        dst = destination.Destination({node}, node, self.store, mock.Mock(),
                                      None, None)
        for op, (side, method) in STEPS.items():
            setattr(src if side == 'source' else dst, method,
                    mock.Mock(name=method, return_value=None))
        dst.prepare.return_value = '/dev/mapper/the-clone'
        return peer.Endpoint(src, dst)

    def _routed(self, endpoint):
        """The step methods of both sides that were called."""
        return [method for side, method in STEPS.values()
                if getattr(getattr(endpoint, side), method).called]

    def _at(self, op):
        """The endpoint of the node a step is meant for."""
        return self.b if STEPS[op][0] == 'destination' else self.a

    @ddt.data(*peer.OPS)
    def test_check(self, op):
        step = {'op': op, 'secret': SECRET}
        self.assertEqual(self.t, self._at(op).check(self.volume, step))
        self.assertEqual([], self._routed(self._at(op)))

    @ddt.data(*peer.OPS)
    def test_forged_steps_are_refused(self, op):
        endpoint = self._at(op)
        for forged in ({'op': op}, {'op': op, 'secret': None},
                       {'op': op, 'secret': ''},
                       {'op': op, 'secret': 'cd' * 16},
                       {'op': op, 'secret': SECRET[:-1]},
                       {'op': op, 'secret': 42}):
            exc = self.assertRaises(dmc_exception.StepRefused,
                                    endpoint.check, self.volume, forged)
            self.assertIn("does not carry the transfer's secret", str(exc))
            self.assertRaises(dmc_exception.StepRefused, endpoint.receive,
                              self.volume, CONNECTOR, forged)
        self.assertEqual([], self._routed(endpoint))

    @ddt.data({'dmclone': {'op': 'reboot', 'secret': SECRET}},
              {'dmclone': None}, {'dmclone': 'retire'})
    def test_malformed_steps_are_refused(self, connector):
        step = peer.payload(connector)
        for endpoint in (self.a, self.b):
            self.assertRaises(dmc_exception.StepRefused, endpoint.receive,
                              self.volume, connector, step)
            self.assertEqual([], self._routed(endpoint))

    @ddt.data(*peer.OPS)
    def test_steps_on_the_wrong_side_are_refused(self, op):
        endpoint = self.a if self._at(op) is self.b else self.b
        exc = self.assertRaises(dmc_exception.StepRefused, endpoint.receive,
                                self.volume, CONNECTOR,
                                {'op': op, 'secret': SECRET})
        self.assertIn('this node is not the', str(exc))
        self.assertEqual([], self._routed(endpoint))

    @ddt.data(*peer.OPS)
    def test_steps_without_a_move_are_refused(self, op):
        self.store.clear(self.ctxt, fake.VOLUME_ID)
        endpoint = self._at(op)
        exc = self.assertRaises(dmc_exception.StepRefused, endpoint.receive,
                                self.volume, CONNECTOR,
                                {'op': op, 'secret': SECRET})
        self.assertIn('no transfer of this volume is recorded', str(exc))
        self.assertEqual([], self._routed(endpoint))

    @ddt.data(*peer.OPS)
    def test_steps_of_a_record_without_secret_are_refused(self, op):
        # A move recorded by release 1.1.0 gets its secret before any step
        # is sent (Side.send): none is ever accepted without one.
        self.db.admin_metadata[fake.VOLUME_ID]['dmclone_secret'] = ''
        for secret in ('', None):
            self.assertRaises(dmc_exception.StepRefused,
                              self._at(op).receive, self.volume, CONNECTOR,
                              {'op': op, 'secret': secret})
        self.assertEqual([], self._routed(self._at(op)))

    def test_prepare_returns_the_clones_path(self):
        step = {'op': peer.PREPARE, 'secret': SECRET, 'hydrate': True,
                'size_gb': 1}
        self.assertEqual('/dev/mapper/the-clone',
                         self.b.receive(self.volume, CONNECTOR, step))
        self.b.destination.prepare.assert_called_once_with(self.volume, step)
        self.assertEqual(['prepare'], self._routed(self.b))

    def test_abort(self):
        step = {'op': peer.ABORT, 'secret': SECRET}
        self.assertIsNone(self.b.receive(self.volume, CONNECTOR, step))
        self.b.destination.abort.assert_called_once_with(self.volume, step)
        self.assertEqual(['abort'], self._routed(self.b))

    def test_abort_of_an_aborted_move(self):
        # The source records a move it could not give up as aborted, and
        # asks again later: still the destination's step.
        self.store.transition(self.ctxt, self.t, move.STATES, move.ABORTED)
        step = {'op': peer.ABORT, 'secret': SECRET}
        self.b.receive(self.volume, CONNECTOR, step)
        self.b.destination.abort.assert_called_once_with(self.volume, step)

    def test_a_detach_passed_on_by_the_source(self):
        step = {'op': peer.DETACHED, 'secret': SECRET}
        self.assertIsNone(self.b.receive(self.volume, CONNECTOR, step))
        self.b.destination.detached_at_source.assert_called_once_with(
            self.volume)
        self.assertEqual(['detached_at_source'], self._routed(self.b))

    @ddt.data(peer.RELEASE, peer.RETIRE)
    def test_source_steps_get_the_senders_connector(self, op):
        step = {'op': op, 'secret': SECRET}
        self.assertIsNone(self.a.receive(self.volume, CONNECTOR, step))
        # With the connector: the export's ACL of the sender goes; and
        # the move the step was checked against, whose mark ends here.
        extra = {'deleting': False} if op == peer.RETIRE else {}
        getattr(self.a.source, op).assert_called_once_with(
            self.volume, CONNECTOR, self.t, **extra)
        self.assertEqual([op], self._routed(self.a))

    @ddt.data(('deleting', True, True), ('error_deleting', True, True),
              ('available', True, False), ('deleting', False, False),
              ('deleting', 'yes', False))
    @ddt.unpack
    def test_a_retire_is_a_deletes_only_if_both_say_so(
            self, status, flag, deleting):
        # The step's entry, and the volume record read for the step.
        self.volume.status = status
        self.a.destination.drop_for_delete = mock.Mock()
        step = {'op': peer.RETIRE, 'secret': SECRET, peer.DELETING: flag}
        self.assertIsNone(self.a.receive(self.volume, CONNECTOR, step))
        self.a.source.retire.assert_called_once_with(
            self.volume, CONNECTOR, self.t, deleting=deleting)
        self.assertEqual(deleting,
                         self.a.destination.drop_for_delete.called)

    def test_check_comes_before_routing(self):
        order = []
        real_check = self.b.check
        self.b.check = mock.Mock(side_effect=lambda *a: (
            order.append('check'), real_check(*a))[1])
        self.b.destination.prepare.side_effect = lambda *a: order.append(
            'prepare')
        step = {'op': peer.PREPARE, 'secret': SECRET}
        self.b.receive(self.volume, CONNECTOR, step)
        self.assertEqual(['check', 'prepare'], order)
        self.b.check.assert_called_once_with(self.volume, step, peer.OPS)

    @ddt.data((peer.PREPARE, peer.BY_TERMINATE),
              (peer.RELEASE, peer.BY_INITIALIZE),
              (peer.RETIRE, peer.BY_INITIALIZE),
              (peer.ABORT, peer.BY_INITIALIZE),
              (peer.DETACHED, peer.BY_INITIALIZE))
    @ddt.unpack
    def test_step_by_the_wrong_call_is_refused(self, op, ops):
        # A prepare by terminate_connection, or a retire answered with a
        # connection by initialize_connection: never a step the other
        # node sends, refused even with the move's secret.
        endpoint = self._at(op)
        exc = self.assertRaises(dmc_exception.StepRefused, endpoint.receive,
                                self.volume, CONNECTOR,
                                {'op': op, 'secret': SECRET}, ops)
        self.assertIn('this call does not carry %s steps' % op, str(exc))
        self.assertEqual([], self._routed(endpoint))

    @ddt.data(*peer.OPS)
    def test_step_by_its_call_is_routed(self, op):
        ops = peer.BY_INITIALIZE if op == peer.PREPARE else peer.BY_TERMINATE
        endpoint = self._at(op)
        endpoint.receive(self.volume, CONNECTOR,
                         {'op': op, 'secret': SECRET}, ops)
        self.assertEqual(1, len(self._routed(endpoint)))
