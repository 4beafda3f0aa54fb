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

"""Requests from one node's volume service to another's.

Cross-node steps of a transfer travel over Cinder's own volume RPC API, to
the service of the other node, never through a shell on it:

* ``initialize_connection`` (an RPC *call*) to the destination, with the
  destination's own connector plus a ``dmclone`` entry describing the step
  (``prepare``: build the clone);
* ``terminate_connection`` (a call) to the source or destination, with a
  ``dmclone`` entry naming the step (``release``: drop the export made for
  the transfer; ``retire``: the volume has left, remove its export and old
  LV; ``abort``: tear down a destination that was never committed).

The same two calls are open to a volume's owner through the public API
(``os-initialize_connection``, ``os-terminate_connection``), with any
connector: every step therefore carries the transfer's secret, which only
the volume services can read (see Transfer.secret), and the receiving
Mover refuses a step without it (Mover.authenticate).  A connector with a
``dmclone`` entry is never treated as an ordinary one.

Each call waits at most ``dmclone_transfer_timeout`` seconds for the other
node, so no RPC worker blocks for longer.
"""

from cinder.volume import rpcapi as volume_rpcapi

PAYLOAD_KEY = 'dmclone'
PREPARE = 'prepare'
RELEASE = 'release'
RETIRE = 'retire'
ABORT = 'abort'
OPS = (PREPARE, RELEASE, RETIRE, ABORT)


def payload(connector):
    """The dmclone step a connector carries, or None if it has none.

    A malformed entry is still a step (an empty one, which no transfer
    accepts): it must never fall through to an ordinary attach.
    """
    if not connector or PAYLOAD_KEY not in connector:
        return None
    value = connector.get(PAYLOAD_KEY)
    if isinstance(value, dict) and value.get('op') in OPS:
        return value
    return {'op': None}


class PeerClient(object):
    """Sends transfer steps to the service of another node."""

    def __init__(self, rpcapi=None, timeout=None):
        self._rpcapi = rpcapi
        self.timeout = timeout

    @property
    def rpcapi(self):
        if self._rpcapi is None:
            api = volume_rpcapi.VolumeAPI()
            if self.timeout:
                # Every call context prepared from this client inherits
                # the bound, instead of the global rpc_response_timeout.
                api.client = api.client.prepare(timeout=self.timeout)
            self._rpcapi = api
        return self._rpcapi

    @staticmethod
    def _at(volume, host):
        """A copy of the volume routed to ``host``'s service."""
        routed = volume.obj_clone()
        routed.host = host
        routed.cluster_name = None
        return routed

    def prepare(self, ctxt, volume, dest_host, connector, secret, **params):
        """Ask the destination to build the clone; returns its conn info."""
        step = dict(params, op=PREPARE, secret=secret)
        return self.rpcapi.initialize_connection(
            ctxt, self._at(volume, dest_host),
            dict(connector, **{PAYLOAD_KEY: step}))

    def request(self, ctxt, volume, host, connector, op, secret):
        """Run ``op`` (release, retire, abort) on ``host``'s service."""
        step = {'op': op, 'secret': secret}
        self.rpcapi.terminate_connection(
            ctxt, self._at(volume, host),
            dict(connector or {}, **{PAYLOAD_KEY: step}))
