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

"""This node's part in moves, wired together once.

A node is the source of some moves and the destination of others; its
volume service holds one :class:`MoveService`: the two sides, the endpoint
that admits the other nodes' steps, recovery, and the hydration monitor
with its tracker.  The driver builds it from its configuration, the
two-node unit model from its fakes: nothing in here calls back into
either.
"""

import functools
import time

from cinder_dmclone import destination
from cinder_dmclone import evidence
from cinder_dmclone import hydration
from cinder_dmclone import peer
from cinder_dmclone import recovery
from cinder_dmclone import source


class MoveService(object):
    """Source, destination, endpoint, recovery and monitor of one node.

    ``tuning`` is the (threshold, batch size) a volume type without
    ``dmclone:`` extra specs gets; ``interval`` the monitor's period;
    ``service_host`` the host part of the volume service's ``host``
    (see :class:`~cinder_dmclone.side.Side`); ``thin_maps`` the
    :class:`~cinder_dmclone.region_map.ThinMaps` of this node when it
    moves only the data of thin volumes (``dmclone_thin_map``), both as
    a source and as a destination; None when it does not.  ``map_marks``
    the node's own marks of clones thin mapped here
    (:class:`~cinder_dmclone.map_mark.MapMarks`), read whether or not the
    option is still on: a clone mapped before it was turned off keeps its
    guard.  ``end_marks`` the node's marks of a move's end begun here
    (see Destination.mark_end).  ``part_marks`` the node's marks of the
    move it takes part in, per volume (the
    :data:`~cinder_dmclone.map_mark.MOVING` directory, see
    :mod:`~cinder_dmclone.evidence`); None: no evidence is kept.
    """

    def __init__(self, node_names, node_name, store, peer_client, clones,
                 target_driver, dm, volume_group, wiper, region_sectors,
                 tuning, interval, stall_timeout=0, ensure_export=None,
                 clock=time.monotonic, service_host=None, thin_maps=None,
                 map_marks=None, end_marks=None, part_marks=None):
        proof = None if part_marks is None else evidence.Evidence(
            part_marks, clones, node_names)
        self.source = source.Source(
            node_names, node_name, store, peer_client, target_driver, dm,
            volume_group, wiper, region_sectors, ensure_export=ensure_export,
            service_host=service_host, thin_maps=thin_maps, evidence=proof)
        self.destination = destination.Destination(
            node_names, node_name, store, peer_client, clones,
            functools.partial(destination.hydration_tuning,
                              threshold=tuning[0], batch_size=tuning[1]),
            clock=clock, service_host=service_host,
            thin_map=thin_maps is not None, marks=map_marks,
            end_marks=end_marks, evidence=proof)
        # (A record that a stale save set back on this node is restored
        # by its destination side, also when a source step finds it.)
        self.source.restore = self.destination.restore_contradicted
        self.endpoint = peer.Endpoint(self.source, self.destination)
        self.recovery = recovery.Recovery(self.source, self.destination)
        self.tracker = hydration.HydrationTracker(
            self.destination, self.recovery, stall_timeout=stall_timeout)
        self.monitor = hydration.HydrationMonitor(
            dm, volume_group, self.tracker.on_status, interval,
            after_tick=self._after_tick)

    def _after_tick(self):
        """Work no clone target reports, once per monitor tick.

        Finalizations that failed, clones a start could not build again
        (their source was down too), failed moves from here whose end the
        database did not take, moves from here a start could not
        abandon (the coordination backend was down), clones of deleted
        volumes a start could not look at (LVM could not list the
        groups), and moves the source recorded aborted that nothing
        loaded here shows (the abort here failed, or its answer was lost).
        """
        self.source.retry_give_ups()
        self.destination.finalize_pending()
        self.recovery.retry_rebuilds()
        self.recovery.retry_abandons()
        self.recovery.retry_deleted()
        self.recovery.retry_aborts()
