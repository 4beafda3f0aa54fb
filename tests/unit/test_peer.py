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

"""Cross-node transfer steps over Cinder's volume RPC API."""

from unittest import mock

import ddt

from cinder import context
from cinder.tests.unit import fake_volume
from cinder.tests.unit import test
from cinder.volume import rpcapi as volume_rpcapi

from cinder_dmclone import peer

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
        self.assertEqual(('prepare', 'release', 'retire', 'abort'), peer.OPS)


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
        for op in (peer.RELEASE, peer.RETIRE, peer.ABORT):
            self.assertIsNone(self.client.request(
                self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                CONNECTOR, op, 'f' * 32))
            ctxt, routed, sent = \
                self.rpcapi.terminate_connection.call_args.args
            self.assertEqual('node-b@dmclone#dmclone', routed.host)
            self.assertEqual(dict(CONNECTOR, dmclone={
                'op': op, 'secret': 'f' * 32}), sent)

    def test_request_without_connector(self):
        self.client.request(self.ctxt, self.volume, 'node-b@dmclone#dmclone',
                            None, peer.ABORT, 'f' * 32)
        sent = self.rpcapi.terminate_connection.call_args.args[2]
        self.assertEqual({'dmclone': {'op': 'abort', 'secret': 'f' * 32}},
                         sent)


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
        self.client.request(self.ctxt, self.volume, 'node-c@dmclone#dmclone',
                            CONNECTOR, peer.RETIRE, 'f' * 32)
        self.assertEqual('node-c', self.prepare.call_args.kwargs['server'])
        args, kwargs = self.cctxt.call.call_args
        self.assertEqual((self.ctxt, 'terminate_connection'), args)
        self.assertEqual(self.volume.id, kwargs['volume_id'])
        self.assertEqual({'op': 'retire', 'secret': 'f' * 32},
                         kwargs['connector']['dmclone'])


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
