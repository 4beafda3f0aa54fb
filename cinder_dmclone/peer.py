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
  (``prepare``: build the clone; for a detached thin source, with the
  regions its LV holds, :data:`REGION_MAP`);
* ``terminate_connection`` (a call) to the source or destination, with a
  ``dmclone`` entry naming the step (``release``: drop the export made for
  the transfer; ``retire``: the volume has left, remove its export and old
  LV; ``abort``: tear down a destination that was never committed;
  ``closed``: before a commit, is the source's copy closed, no instance
  there using it any more?; ``detached``: a detach of the destination's
  connection reached the source, see Source.pass_on_detach).

The same two calls are open to a volume's owner through the public API
(``os-initialize_connection``, ``os-terminate_connection``), with any
connector: every step therefore carries the move's secret, which only the
volume services can read (see Move.secret).  Every step enters a node
through one door, the :class:`Endpoint`, which refuses a step without it
and routes the others to the node's source or destination side.  A
connector with a ``dmclone`` entry is never treated as an ordinary one.

Each call waits at most ``dmclone_transfer_timeout`` seconds for the other
node, so no RPC worker blocks for longer.
"""

from cinder.volume import rpcapi as volume_rpcapi
from cinder.volume import volume_utils

PAYLOAD_KEY = 'dmclone'
PREPARE = 'prepare'
RELEASE = 'release'
RETIRE = 'retire'
ABORT = 'abort'
CLOSED = 'closed'
DETACHED = 'detached'
OPS = (PREPARE, RELEASE, RETIRE, ABORT, CLOSED, DETACHED)
#: The steps each of the two calls carries: a prepare comes by
#: initialize_connection (it answers with a connection), the others by
#: terminate_connection.
BY_INITIALIZE = (PREPARE,)
BY_TERMINATE = (RELEASE, RETIRE, ABORT, CLOSED, DETACHED)
#: The entry of a retire step sent by a delete of the volume (True): the
#: source removes every copy of the volume it holds, also the clone of
#: a move into it that a stale save removed from the record
#: (:meth:`Endpoint.deleting`).  A release without it retires as before.
DELETING = 'deleting'
#: The entry of a prepare step that carries the regions a thin source
#: holds (:func:`cinder_dmclone.thin.encode_regions`); absent when every
#: region is to be copied.
REGION_MAP = 'region_map'


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
    """Sends the steps of a move to the service of another node.

    ``node_name`` names this node in the connector a step carries (the
    source drops the ACL of the destination's initiator with it);
    ``connector`` replaces os-brick's properties of this node (tests).
    """

    def __init__(self, rpcapi=None, timeout=None, node_name=None,
                 connector=None):
        self._rpcapi = rpcapi
        self.timeout = timeout
        self.node_name = node_name
        self._connector = connector

    def own_connector(self):
        """This node's initiator, as os-brick describes it."""
        if self._connector is None:
            props = volume_utils.brick_get_connector_properties()
            props['host'] = self.node_name
            self._connector = props
        return dict(self._connector)

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

    def request(self, ctxt, volume, host, op, secret, deleting=False):
        """Run ``op`` (a BY_TERMINATE step) on ``host``.

        ``deleting``: a retire sent by a delete of the volume
        (:data:`DELETING`).
        """
        step = {'op': op, 'secret': secret}
        if deleting:
            step[DELETING] = True
        self.rpcapi.terminate_connection(
            ctxt, self._at(volume, host),
            dict(self.own_connector(), **{PAYLOAD_KEY: step}))


class Endpoint(object):
    """The one door of node-to-node steps into this node.

    The driver hands it every connector that carries a step (see
    :func:`payload`), from ``create_export``, ``initialize_connection``
    and ``terminate_connection``; test harnesses do the same and replace
    only the transport (the PeerClient's ``rpcapi``).  A step is checked
    first (:meth:`cinder_dmclone.side.Side.authenticate`: the move's
    secret, this node's side of it), then routed.
    """

    def __init__(self, source, destination):
        self.source = source
        self.destination = destination

    def check(self, volume, step, ops=OPS):
        """The move ``step`` belongs to; StepRefused if it is forged.

        ``ops``: the steps the call it came by carries (BY_INITIALIZE,
        BY_TERMINATE); any other is refused.
        """
        return self.destination.authenticate(volume, step, ops)

    def receive(self, volume, connector, step, ops=OPS):
        """Run a checked step; a prepare returns the clone's path."""
        t = self.check(volume, step, ops)
        op = step['op']
        if op == PREPARE:
            return self.destination.prepare(volume, step)
        if op == ABORT:
            self.destination.abort(volume, step)
        elif op == DETACHED:
            self.destination.detached_at_source(volume)
        elif op == RELEASE:
            self.source.release(volume, connector, t)
        elif op == RETIRE:
            self._retire(volume, connector, step, t)
        elif op == CLOSED:
            self.source.confirm_closed(volume, t)
        return None

    def _retire(self, volume, connector, step, t):
        """A retire; for a delete, every copy of the volume here goes.

        (:meth:`deleting`.)  First what this node's mark names as the
        destination of another move (Destination.drop_for_delete), then
        the copy the record names this node the source of.
        """
        deleting = self.deleting(volume, step)
        if deleting:
            self.destination.drop_for_delete(volume)
        self.source.retire(volume, connector, t, deleting=deleting)

    @staticmethod
    def deleting(volume, step):
        """True if retire ``step`` is sent by a delete of the volume.

        The step says so (:data:`DELETING`), and the volume record, read
        for this step, says so too: Cinder sets ``deleting`` before it
        asks the volume's node to delete it (``error_deleting`` when a
        delete failed, for the owner to try again).  A delete needs no
        move of the volume to survive: nothing this node holds of it is
        kept for one.
        """
        return step.get(DELETING) is True and \
            volume['status'] in ('deleting', 'error_deleting')
