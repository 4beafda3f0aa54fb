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

"""Configuration options of the dm-clone driver.

They live in a backend section of cinder.conf next to Cinder's own LVM
options (``volume_group``, ``lvm_type``, ``target_helper`` ...), which the
driver inherits.  ``list_opts`` feeds ``oslo-config-generator`` through the
``oslo.config.opts`` entry point.
"""

import copy

from oslo_config import cfg
from oslo_config import types

from cinder.volume import configuration

#: Region size bounds in KiB (dm-clone: 8 .. 2097152 sectors).
MIN_REGION_KB = 4
MAX_REGION_KB = 1024 * 1024

dmclone_opts = [
    cfg.StrOpt('dmclone_metadata_volume_group',
               help='Volume group holding the dm-clone metadata LVs of '
                    'volumes in transfer. Unset means the backend\'s '
                    'volume_group. Metadata is written on every first write '
                    'to a region, so a VG on a faster device than the data '
                    'keeps the write cost of a volume in transfer close to '
                    'that of a plain LV.'),
    cfg.IntOpt('dmclone_region_size',
               default=64,
               min=MIN_REGION_KB,
               max=MAX_REGION_KB,
               help='dm-clone region size in KiB: the unit of copying and '
                    'of the hydration bitmap. A power of two from 4 to '
                    '1048576. Smaller regions make partial first writes '
                    'cheaper; larger ones hydrate faster and need less '
                    'metadata.'),
    cfg.IntOpt('dmclone_hydration_threshold',
               default=64,
               min=1,
               help='Maximum number of regions being hydrated at once in '
                    'the background (dm-clone "hydration_threshold"). The '
                    'kernel default is 1. Overridable per volume type with '
                    'the extra spec "dmclone:hydration_threshold".'),
    cfg.IntOpt('dmclone_hydration_batch_size',
               default=16,
               min=1,
               help='Number of contiguous regions dm-clone copies in one '
                    'batch during background hydration '
                    '("hydration_batch_size"). The kernel default is 1, '
                    'which is slow over iSCSI. Overridable per volume type '
                    'with the extra spec "dmclone:hydration_batch_size".'),
    cfg.IntOpt('dmclone_monitor_interval',
               default=10,
               min=1,
               help='Seconds between two runs of the hydration monitor, '
                    'which reads the status of all clone targets with one '
                    'dmsetup call and finalizes finished transfers.'),
    cfg.IntOpt('dmclone_stall_timeout',
               default=300,
               min=0,
               help='Seconds a hydrating clone may go without copying a '
                    'region before the monitor reports the transfer as '
                    'stalled: an error in the log naming the source and '
                    'its iSCSI session, and "stalled" in the transfer\'s '
                    'progress in the pool stats. Hydration stops when the '
                    'destination cannot read the source (network cut, '
                    'source node down); it resumes by itself when the '
                    'path is back. 0 turns the report off.'),
    cfg.IntOpt('dmclone_transfer_timeout',
               default=45,
               min=10,
               help='Seconds a transfer step may wait for the volume service '
                    'of the other node (each RPC call between the two '
                    'nodes) before it fails cleanly and is rolled back. It '
                    'must cover the destination\'s iSCSI login to the '
                    'source. A failing attach waits on two such calls (the '
                    'prepare, then the abort that undoes it), the source\'s '
                    'detach in a live migration on one (the source\'s '
                    'word that its copy is closed): keep twice '
                    'this value below rpc_response_timeout, or the failure '
                    'reaches the caller as an RPC timeout instead of the '
                    'driver\'s error (the move is rolled back either way).'),
    cfg.FloatOpt('dmclone_metadata_reserve',
                 default=2.0,
                 min=1.0,
                 help='Factor applied to the size of the hydration bitmap '
                      '(one bit per region) when sizing a metadata LV, to '
                      'leave room for the metadata\'s own structures. The '
                      'result is rounded up to whole MiB, at least 8 MiB.'),
    cfg.StrOpt('dmclone_node_name',
               help='The name compute services use for this node in their '
                    'connectors ("host"). An attach whose connector names '
                    'this node gets a local connection. Unset means the '
                    'host part of this cinder-volume service\'s "host" (or '
                    '"backend_host"); never the machine\'s hostname.'),
    cfg.BoolOpt('dmclone_shared_file_locks',
                default=False,
                help='Accept a file:// coordination backend_url because '
                     'its directory is on a file system every node of '
                     'this backend shares (for example a cluster file '
                     'system), so its locks hold across the nodes. Without '
                     'it the driver refuses to start with file:// (Cinder\'s '
                     'default), whose locks hold on one node only and do '
                     'not serialise the two sides of a move.'),
    cfg.BoolOpt('dmclone_thin_map',
                default=False,
                help='Move only the data of a thin volume that no instance '
                     'uses (cinder migrate, or an attach on another node '
                     'while nothing on the volume\'s node uses it): its '
                     'node reads which regions its thin LV maps from the '
                     'thin pool\'s metadata (a metadata snapshot and '
                     'thin_dump, from thin-provisioning-tools), and the '
                     'destination marks the other regions copied, with '
                     'discards, before the background copy starts; the '
                     'volume stays thin and only its data crosses the '
                     'network. Used only when both nodes set it, the '
                     'source LV is thin, and the destination\'s LV is '
                     'thin in a pool that zeroes new blocks (LVM --zero '
                     'y, the default); any other move, and every live '
                     'migration, copies every region. The destination\'s '
                     'thin pool check and pool stats then count what such '
                     'a move copies, with room for writes during it (the '
                     'rest of the volume over max_over_subscription_ratio), '
                     'not the whole volume. Off by default until '
                     'the kernel behaviour it relies on is proven on the '
                     'testbed.'),
    cfg.IntOpt('dmclone_thin_map_max_mappings',
               default=1000000,
               min=1,
               help='With dmclone_thin_map: the most pieces (mappings of '
                    'the thin pool) the map of one thin volume may hold. '
                    'A volume whose thin LV maps more blocks than this (the '
                    'kernel\'s count, read before the map) gets no map, '
                    'and a thin_dump that grows past what this many '
                    'mappings take (128 bytes each) is stopped: every '
                    'region of such a volume is copied, logged. How '
                    'fragmented a volume is, its user decides; this bounds '
                    'the memory and time its map costs the volume service '
                    '(about 130 MB of thin_dump output, read 1 MiB at a '
                    'time, and up to about 250 MB of ranges while they '
                    'are turned into regions, at the default; a volume '
                    'holding its data in few pieces is a few KB). At the '
                    'pool\'s smallest chunk size (64 KiB), the default '
                    'maps volumes holding up to 61 GiB.'),
    cfg.ListOpt('dmclone_node_aliases',
                item_type=types.String(),
                default=[],
                help='Other names connectors may use for this node, for '
                     'example its fully qualified domain name.'),
]

CONF = cfg.CONF
CONF.register_opts(dmclone_opts, group=configuration.SHARED_CONF_GROUP)


def list_opts():
    """Options for oslo-config-generator, in the backend section."""
    return [(configuration.SHARED_CONF_GROUP, copy.deepcopy(dmclone_opts))]
