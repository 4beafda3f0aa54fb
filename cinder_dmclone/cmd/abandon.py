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

"""``cinder-dmclone move abandon-source``: this node, wired from cinder.conf.

The command acts as the volume service of this node would: Cinder's
database, the coordination backend (the volume's lock, the one the
driver's steps take), the backend section's volume groups, os-brick's
iSCSI connector.  :func:`from_config` builds the
:class:`~cinder_dmclone.lost_source.LostSource` from the same
configuration files the node's ``cinder-volume`` reads (several
``--config-file``, later ones win, as with oslo.config); everything is
imported late, so that the read-only commands never load it.
"""

import os
import socket
import stat
import urllib.parse

from oslo_concurrency import processutils
from oslo_config import cfg

from cinder_dmclone.cmd import status

DEFAULT_CONFIG = status.DEFAULT_CONFIG
#: How cinder's coordinator names the files of the driver's locks in a
#: ``file://`` backend (``cinder-`` and the lock's name).
LOCK_FILE_PREFIX = 'cinder-dmclone-'

_BACKEND_OPTS = [
    cfg.StrOpt('volume_driver'),
    cfg.StrOpt('volume_group'),
    cfg.StrOpt('dmclone_metadata_volume_group'),
    cfg.StrOpt('lvm_type'),
    cfg.StrOpt('lvm_conf_file'),
    cfg.StrOpt('backend_host'),
    cfg.StrOpt('dmclone_node_name'),
    cfg.ListOpt('dmclone_node_aliases'),
    cfg.BoolOpt('dmclone_shared_file_locks'),
    cfg.IntOpt('dmclone_thin_map_max_mappings'),
]


def node_config(config_files, backend=None):
    """What the command needs of the node's backend section: a dict.

    Raises status.UsageError with a message an operator can act on.
    """
    conf = cfg.ConfigOpts()
    conf.register_opts([
        cfg.ListOpt('enabled_backends', default=[]),
        cfg.StrOpt('host', default=socket.gethostname()),
        cfg.StrOpt('state_path', default='/var/lib/cinder')])
    conf.register_opts(_BACKEND_OPTS, group='backend_defaults')
    missing = [path for path in config_files if not os.path.exists(path)]
    if missing:
        raise status.UsageError('no such file: %s' % ', '.join(missing))
    try:
        conf(args=[], project='cinder', default_config_files=config_files)
    except (cfg.ConfigFilesNotFoundError, cfg.ConfigFileParseError) as exc:
        raise status.UsageError('cannot read %s: %s'
                                % (', '.join(config_files), exc)) from None
    sections = [backend] if backend else list(conf.enabled_backends)
    for section in sections:
        conf.register_opts(_BACKEND_OPTS, group=section)
    if not backend:
        sections = [s for s in sections if status._backend_value(
            conf, s, 'volume_driver') == status.DRIVER]
    if len(sections) != 1 or sections[0] not in conf.list_all_sections():
        raise status.UsageError(
            'name the backend section of this driver with --backend '
            '(found %s)' % (', '.join(sections) or 'none'))
    section = sections[0]

    def value(name, default=None):
        return status._backend_value(conf, section, name, default)
    vg = value('volume_group', 'cinder-volumes')
    host = value('backend_host') or conf.host
    node = value('dmclone_node_name') or host.partition('@')[0]
    return {'section': section, 'volume_group': vg,
            'metadata_volume_group': value('dmclone_metadata_volume_group',
                                           vg),
            'lvm_type': value('lvm_type', 'default'),
            'lvm_conf': value('lvm_conf_file', '/etc/cinder/lvm.conf'),
            'node_names': {node} | set(value('dmclone_node_aliases') or []),
            'shared_file_locks': value('dmclone_shared_file_locks', False),
            'node_name': node,
            'thin_map_max_mappings': value('dmclone_thin_map_max_mappings'),
            'state_dir': os.path.join(conf.state_path, 'dmclone')}


def give_back_lock_files(backend_url):
    """Give the driver's lock files root made their directory's owner.

    With a ``file://`` coordination backend (``dmclone_shared_file_locks``)
    tooz creates a lock's file at its first use.  This command runs as
    root: a lock file it created (the volume's, or a thin pool's, which
    the node's service may never have taken) would be root's, and the
    service, not root, could never take that lock again.  Only regular
    files named as the driver's locks, owned by root, in a directory
    that is not root's; a symbolic link is never followed.
    """
    url = urllib.parse.urlparse(backend_url or '')
    if url.scheme != 'file' or os.geteuid() != 0:
        return
    try:
        owner = os.stat(url.path)
        names = os.listdir(url.path)
    except OSError:
        return
    if owner.st_uid == 0:
        return
    for name in names:
        if not name.startswith(LOCK_FILE_PREFIX):
            continue
        path = os.path.join(url.path, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == 0:
                os.chown(path, owner.st_uid, owner.st_gid,
                         follow_symlinks=False)
        except OSError:
            continue


def _lvm(name, node, root_helper):
    from cinder.brick.local_dev import lvm as brick_lvm
    conf = node['lvm_conf']
    return brick_lvm.LVM(name, root_helper, lvm_type='default',
                         executor=processutils.execute,
                         lvm_conf=None if conf.lower() == 'none' else conf)


def _iscsi_connector(root_helper):
    """os-brick's iSCSI connector, its privileged calls in this process.

    The command runs as root: no privsep daemon to start through sudo.
    """
    import os_brick
    from os_brick.initiator import connector
    from os_brick import privileged

    os_brick.setup(cfg.CONF)
    privileged.default.set_client_mode(False)
    return connector.InitiatorConnector.factory(
        'ISCSI', root_helper, use_multipath=False, device_scan_attempts=3)


def from_config(args):
    """(LostSource, close) for the parsed arguments of the command.

    ``close()`` stops the coordination backend and gives the lock files
    this command created back to the service (:func:`give_back_lock_files`).
    """
    from cinder.common import config  # noqa: F401 (registers options)
    from cinder import coordination
    from cinder.db import api as db_api
    from cinder import objects

    from cinder_dmclone import clone
    from cinder_dmclone import lost_source
    from cinder_dmclone import move
    from cinder_dmclone import privileged
    from cinder_dmclone import region_map
    from cinder_dmclone import source

    files = args.config_file or [DEFAULT_CONFIG]
    node = node_config(files, args.backend)
    objects.register_all()
    cfg.CONF(args=[], project='cinder', default_config_files=files)
    # (The driver's own check: the command takes the volume's lock, which
    # must be the one the other node's service takes.)
    move.check_coordination(cfg.CONF.coordination.backend_url,
                            node['shared_file_locks'])
    root_helper = 'sudo'      # (never used: the command runs as root)
    dm = privileged.DMSetup(execute=processutils.execute)
    vg = _lvm(node['volume_group'], node, root_helper)
    meta_vg = vg if node['metadata_volume_group'] == node['volume_group'] \
        else _lvm(node['metadata_volume_group'], node, root_helper)
    clones = clone.Clones(dm, vg, meta_vg, _iscsi_connector(root_helper),
                          processutils.execute, root_helper,
                          lvm_type=node['lvm_type'])
    # (What the node's service would read of its thin LVs, under the
    # same pool lock: see DMCloneVolumeDriver._thin_maps.)
    thin_maps = region_map.ThinMaps(
        node['node_name'], node['volume_group'], node['state_dir'],
        execute=processutils.execute, root_helper=root_helper,
        stream=privileged.stream_output,
        max_mappings=(node['thin_map_max_mappings']
                      or region_map.ThinMaps.MAX_MAPPINGS),
        # An operator's command has no move's budget, and without the
        # map it would write zeroes over every range never copied
        # (mapping a thin LV whole): it waits for another reader's dump,
        # saying so, as long as the operator lets it.
        lock_wait=None)
    coordination.COORDINATOR.start()
    command = lost_source.LostSource(
        node['node_names'], move.Store(db_api), clones, node['state_dir'],
        load_volume=objects.Volume.get_by_id,
        service_is_up=source.service_is_up, thin_maps=thin_maps)

    def close():
        coordination.COORDINATOR.stop()
        give_back_lock_files(cfg.CONF.coordination.backend_url)
    return command, close
