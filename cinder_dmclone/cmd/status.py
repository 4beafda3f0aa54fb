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

"""What the driver has on this node: the report of ``cinder-dmclone``.

The read commands of ``cinder-dmclone`` (:mod:`cinder_dmclone.cmd.cli`:
``status``, ``handle list``, ``move list``, ``leftover list``) show parts
of one report, built here by plain functions that know nothing of the
command line's framework.  Run as root on a node.  The report lists every
volume handle (``dmclone-*`` device-mapper devices, see
:mod:`cinder_dmclone.layout`), every transfer into the node (handles with
a ``clone`` table) with its progress, and the leftovers a crash can leave
behind:

* a metadata LV ``<lv>-dmcmeta`` with no clone target on the volume's
  handle (normal for a moment while a transfer finalizes, and after a
  reboot until the volume service's startup recovery has rebuilt the
  clone; anything else needs an operator);
* a handle whose LV does not exist;
* an old copy renamed ``<lv>-dmcwipe-<token>`` while the volume service
  wipes it (:mod:`cinder_dmclone.wiper`): listed, but normal work, so it
  alone does not change the exit status;
* with the database, an LV named like a volume's, without a handle,
  that the volume's admin metadata names as the old copy a move away
  from a node left when an operator abandoned it as lost
  (``dmclone_old_copy_<node>``, ``dmclone_lost_source_lv``): it stays
  until an operator removes it by hand.

What it reads, and why the figures can be trusted:

* ONE ``dmsetup status`` call gives the table type and the dm-clone
  counters of every device at the same instant.  When a clone is
  hydrating and ``--interval`` is above zero, a second ``dmsetup status``
  call ``--interval`` seconds later gives the rate and ETA, computed by
  the hydration monitor's own code
  (:func:`cinder_dmclone.hydration.compute_progress`): they are measured
  here, not copied.  With ``--interval 0`` the rate and ETA are the
  monitor's last published values when the database can be read, and
  unknown otherwise.
* ``dmsetup table --target clone`` gives each clone's source device; the
  iSCSI portal behind it comes from ``/dev/disk/by-path``.
* ``dmsetup info -c`` gives the dm UUIDs (handles made by the driver have
  ``DMCLONE-`` ones), ``lvs`` the logical volumes.
* With ``--config-file`` and a ``[database] connection`` there, the
  volume's admin metadata (``dmclone_state``, ``dmclone_source_node``,
  progress published by the monitor) is read too; ``--no-db`` skips it.
  The volume of an LV is then the one whose name the LV has (its
  ``_name_id`` when it has one: :func:`owner_reader`); without the
  database, the id in the LV's name, which is the volume's own only
  while it has no ``_name_id``.

The commands run directly (the tool must run as root): the driver's
rootwrap filters admit only the commands the service runs, not these.
A device whose status line cannot be parsed is left out and reported
(a handle of the driver's under ``unreadable``); the others are listed
as usual.

Exit status (:func:`exit_code`, of ``cinder-dmclone status``): 0 when
all is well, 1 when leftovers (other than old copies being wiped), failed
clones or unreadable handles were found, 2 on bad usage or when a command
fails.
"""

import dataclasses
import os
import re
import socket
import time

from oslo_concurrency import processutils
from oslo_config import cfg

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import hydration
from cinder_dmclone import layout
from cinder_dmclone import move
from cinder_dmclone import privileged

DRIVER = 'cinder_dmclone.driver.DMCloneVolumeDriver'
DEFAULT_CONFIG = '/etc/cinder/cinder.conf'
BY_PATH = '/dev/disk/by-path'
_ISCSI_LINK_RE = re.compile(
    r'^ip-(?P<portal>.+?)-iscsi-(?P<iqn>.+)-lun-(?P<lun>[0-9]+)$')

#: the kinds of leftovers
METADATA_WITHOUT_CLONE = 'metadata_lv_without_clone'
HANDLE_WITHOUT_LV = 'handle_without_lv'
RETIRING = 'retiring_lv'
ABANDONED_COPY = 'abandoned_copy'


class UsageError(Exception):
    """Bad arguments or configuration: told to the operator, exit 2."""


@dataclasses.dataclass
class Scope:
    """Which volume groups to look at.

    ``metadata_vgs`` maps each data VG to the VG of its metadata LVs.  An
    empty mapping means "every VG on the node" (no configuration given).
    """

    metadata_vgs: dict = dataclasses.field(default_factory=dict)
    name_template: str = 'volume-%s'
    database: bool = False
    #: The names this node goes by in volume and move records (its
    #: backends' ``dmclone_node_name``, or the host part of their
    #: ``backend_host``/``host``, and ``dmclone_node_aliases``); empty
    #: when unknown (no configuration given).
    node_names: frozenset = frozenset()

    @property
    def everything(self):
        return not self.metadata_vgs

    def has_vg(self, vg):
        return self.everything or vg in self.metadata_vgs

    def data_vgs_for_metadata(self, meta_vg):
        """Data VGs whose metadata LVs live in ``meta_vg`` (None: any)."""
        if self.everything:
            return None
        return {vg for vg, meta in self.metadata_vgs.items()
                if meta == meta_vg}

    def lvm_vgs(self):
        """VG arguments for ``lvs`` (none: every VG)."""
        return sorted(set(self.metadata_vgs) |
                      set(self.metadata_vgs.values()))


# --------------------------------------------------------------------------
# Arguments and configuration
# --------------------------------------------------------------------------

def check_args(args):
    """Reject option combinations that make no sense (UsageError).

    ``args`` carries ``config_file``, ``backend``, ``volume_group``,
    ``metadata_volume_group`` and ``interval``: the options of the
    ``cinder-dmclone`` commands that read this node.
    """
    if args.interval < 0:
        raise UsageError('--interval must not be negative')
    if args.config_file and args.volume_group:
        raise UsageError('use either --config-file or --volume-group, '
                         'not both')
    if args.backend and not args.config_file:
        raise UsageError('--backend needs --config-file')
    if args.metadata_volume_group and not args.volume_group:
        raise UsageError('--metadata-volume-group needs --volume-group')


_BACKEND_OPTS = [
    cfg.StrOpt('volume_driver'),
    cfg.StrOpt('volume_group'),
    cfg.StrOpt('dmclone_metadata_volume_group'),
    cfg.StrOpt('backend_host'),
    cfg.StrOpt('dmclone_node_name'),
    cfg.ListOpt('dmclone_node_aliases'),
]


def _backend_value(conf, section, name, default=None):
    """A backend option as Cinder resolves it: section, backend_defaults."""
    value = conf[section][name]
    if value is None:
        value = conf['backend_defaults'][name]
    return default if value is None else value


def load_config(path, backends=None):
    """The Scope of the dm-clone backends of a cinder.conf.

    Raises UsageError with a message an operator can act on.
    """
    conf = cfg.ConfigOpts()
    conf.register_opts([cfg.ListOpt('enabled_backends', default=[]),
                        cfg.StrOpt('volume_name_template',
                                   default='volume-%s'),
                        cfg.StrOpt('host', default=socket.gethostname())])
    conf.register_opts([cfg.StrOpt('connection', secret=True)],
                       group='database')
    conf.register_opts(_BACKEND_OPTS, group='backend_defaults')
    try:
        conf(args=[], project='cinder', default_config_files=[path])
    except (cfg.ConfigFilesNotFoundError, cfg.ConfigFileParseError) as exc:
        raise UsageError('cannot read %s: %s' % (path, exc)) from None
    sections = backends or conf.enabled_backends
    for section in sections:
        conf.register_opts(_BACKEND_OPTS, group=section)
    if not backends:
        sections = [s for s in sections
                    if _backend_value(conf, s, 'volume_driver') == DRIVER]
    if not sections:
        raise UsageError(
            'no enabled backend of %s has volume_driver = %s; name the '
            'section with --backend' % (path, DRIVER))
    scope = Scope(name_template=conf.volume_name_template,
                  database=bool(conf.database.connection))
    names = set()
    for section in sections:
        if section not in conf.list_all_sections():
            raise UsageError('%s has no [%s] section' % (path, section))
        vg = _backend_value(conf, section, 'volume_group', 'cinder-volumes')
        scope.metadata_vgs[vg] = _backend_value(
            conf, section, 'dmclone_metadata_volume_group', vg)
        names |= _node_names(conf, section)
    scope.node_names = frozenset(names)
    return scope


def _node_names(conf, section):
    """The names a backend's driver goes by (its ``node_name``, aliases)."""
    host = _backend_value(conf, section, 'backend_host') or conf.host
    name = (_backend_value(conf, section, 'dmclone_node_name')
            or host.partition('@')[0])
    return {name} | set(_backend_value(conf, section,
                                       'dmclone_node_aliases') or [])


def scope_from_args(args):
    if args.config_file:
        return load_config(args.config_file, args.backend)
    scope = Scope()
    for vg in args.volume_group or []:
        scope.metadata_vgs[vg] = args.metadata_volume_group or vg
    return scope


# --------------------------------------------------------------------------
# Reading the node
# --------------------------------------------------------------------------

def iscsi_links(by_path=BY_PATH):
    """{'major:minor': (portal, iqn, lun)} of the node's iSCSI disks."""
    links = {}
    try:
        names = os.listdir(by_path)
    except OSError:
        return links
    for name in names:
        match = _ISCSI_LINK_RE.fullmatch(name)
        if not match:
            continue
        try:
            rdev = os.stat(os.path.join(by_path, name)).st_rdev
        except OSError:
            continue
        links['%d:%d' % (os.major(rdev), os.minor(rdev))] = (
            match.group('portal'), match.group('iqn'),
            int(match.group('lun')))
    return links


def _cinder_database(config_file):
    """(admin context, Cinder's DB API) with ``config_file``'s settings.

    Imported late: only the readers below need the database and Cinder's
    global configuration.
    """
    from cinder.common import config  # noqa: F401 (registers options)
    from cinder import context
    from cinder.db import api as db

    cfg.CONF(args=[], project='cinder', default_config_files=[config_file])
    return context.get_admin_context(), db


def database_reader(config_file):
    """A function volume_id -> admin metadata, through Cinder's DB API."""
    ctxt, db = _cinder_database(config_file)
    return lambda volume_id: db.volume_admin_metadata_get(ctxt, volume_id)


def host_reader(config_file):
    """A function volume_id -> the volume's ``host``, through Cinder's DB."""
    ctxt, db = _cinder_database(config_file)
    return lambda volume_id: db.volume_get(ctxt, volume_id)['host']


def owner_reader(config_file, template):
    """A function LV name -> the id of the volume it is the LV of, or None.

    A volume's LV is ``template`` % its ``_name_id`` when it has one
    (after Cinder's generic migration of an in-use volume, the id of a
    deleted temporary volume), else % its id: the id in the LV's name is
    looked up as both, and only a volume whose name is exactly the LV's
    owns it.
    """
    from cinder import exception

    ctxt, db = _cinder_database(config_file)

    def owner(lv_name):
        named = volume_id(lv_name, template)
        if named is None:
            return None
        volumes = list(db.volume_get_all(ctxt,
                                         filters={'_name_id': named}))
        try:
            volumes.append(db.volume_get(ctxt, named))
        except exception.VolumeNotFound:
            pass
        return next((v['id'] for v in volumes
                     if template % v.name_id == lv_name), None)
    return owner


def volume_id(lv_name, template):
    """The UUID in an LV name made from ``volume_name_template``.

    The volume's own id, unless a volume has it as its ``_name_id``
    (:func:`owner_reader` tells which).
    """
    pattern = re.escape(template).replace(re.escape('%s'), '(?P<id>.+)')
    match = re.fullmatch(pattern, lv_name)
    return match.group('id') if match else None


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def _hydrating(lines):
    return any(line.clone is not None and not line.clone.failed
               and line.clone.hydration_enabled
               and not line.clone.fully_hydrated for line in lines)


def _table_type(lines):
    targets = [line.target for line in lines]
    if 'clone' in targets:
        return 'clone'
    return '+'.join(sorted(set(targets))) or 'none'


def take_samples(dm, interval, sleep=time.sleep, clock=time.monotonic,
                 errors=None):
    """One status sample of every device, two while a clone hydrates.

    Returns (first, second, seconds between them); second is None when
    one sample was enough.  Devices whose status line cannot be parsed
    are left out of both and put in ``errors`` (see DMSetup.statuses).
    """
    t1 = clock()
    first = dm.statuses(errors=errors)
    if interval <= 0 or not any(
            _hydrating(lines) for name, lines in first.items()
            if layout.parse_handle(name)):
        return first, None, None
    sleep(interval)
    t2 = clock()
    return first, dm.statuses(errors=errors), t2 - t1


def _number(value):
    """An admin metadata number (a string, maybe empty) or None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _transfer(handle, lines, earlier, elapsed, table, links, metadata,
              meta_vg, lvs):
    """The transfer entry of a handle whose table is a clone."""
    status = next(line.clone for line in lines if line.clone is not None)
    entry = {'handle': handle['name'], 'volume_id': handle['volume_id'],
             'volume_group': handle['volume_group'],
             'lv_name': handle['lv_name'],
             'metadata_lv': layout.metadata_lv_name(handle['lv_name']),
             'metadata_volume_group': meta_vg,
             'state': metadata.get('dmclone_state'),
             'source_node': metadata.get('dmclone_source_node'),
             'source_device': None, 'source_portal': None,
             'source_iqn': None, 'failed': status.failed}
    entry['metadata_lv_exists'] = (
        None if meta_vg is None else
        (meta_vg, entry['metadata_lv']) in lvs)
    clone_segments = [s for s in table if s.target == 'clone']
    if clone_segments:
        args = dmsetup.parse_clone_table(clone_segments[0])
        entry['source_device'] = args.source_dev
        if args.source_dev in links:
            portal, iqn, _lun = links[args.source_dev]
            entry['source_portal'], entry['source_iqn'] = portal, iqn
    if status.failed:
        entry['kernel_state'] = status.state
        return entry
    previous = None
    if earlier is not None and not earlier.failed:
        previous = hydration.compute_progress(earlier)
    progress = hydration.compute_progress(status, previous, elapsed)
    rate, eta, source = progress.rate, progress.eta, None
    if rate is not None:
        source = 'sampled'
    elif metadata.get('dmclone_rate_bps'):
        rate = _number(metadata.get('dmclone_rate_bps'))
        eta = _number(metadata.get('dmclone_eta_seconds'))
        source = 'monitor'
    entry.update(
        hydration_enabled=status.hydration_enabled,
        hydrated_regions=status.hydrated_regions,
        total_regions=status.total_regions,
        hydrating_regions=status.hydrating_regions,
        region_bytes=progress.region_bytes,
        percent=progress.percent, rate_bps=rate, eta_seconds=eta,
        rate_source=source,
        stalled_seconds=_number(metadata.get('dmclone_stalled_seconds')),
        stale_source_attachment=metadata.get(
            'dmclone_stale_source_attachment'),
        awaiting_source=metadata.get('dmclone_awaiting_source'))
    return entry


def _ours(scope, name):
    """True if ``name`` is a handle of a volume group in scope."""
    parsed = None if name is None else layout.parse_handle(name)
    return parsed is not None and scope.has_vg(parsed[0])


def _unreadable(scope, status_errors, table_errors, report):
    """Report the lines that could not be parsed, the driver's only.

    A handle whose status line is unreadable is listed under
    ``unreadable`` (and makes the exit status 1); a line without a device
    name could be anyone's, so it is a warning.
    """
    for name, exc in sorted(status_errors.items(), key=lambda e: str(e[0])):
        if name is None:
            report['warnings'].append('unreadable dmsetup status output: '
                                      '%s' % exc)
        elif _ours(scope, name):
            report['unreadable'].append({'name': name, 'reason': str(exc)})
            report['warnings'].append('cannot read the status of %s: %s'
                                      % (name, exc))
    for name, exc in sorted(table_errors.items(), key=lambda e: str(e[0])):
        if name is None or _ours(scope, name):
            report['warnings'].append('cannot read the table of %s: %s'
                                      % (name or 'a device', exc))


def _owner(scope, lv_name, read_owner, report):
    """The id of the volume whose LV ``lv_name`` is, or None.

    With the database (``read_owner``, see :func:`owner_reader`) the
    volume whose name the LV has; without it, the id in the LV's name,
    which is the volume's unless it has a ``_name_id``.
    """
    if read_owner is None:
        return volume_id(lv_name, scope.name_template)
    try:
        return read_owner(lv_name)
    except Exception as exc:
        report['warnings'].append('volume of LV %s not read from the '
                                  'database: %s' % (lv_name, exc))
        return None


def build_report(scope, first, second, elapsed, uuids, tables, lvs, links,
                 read_metadata=None, status_errors=None, table_errors=None,
                 read_host=None, read_owner=None):
    """Everything the tool prints, as one JSON-ready dict."""
    statuses = second if second is not None else first
    report = {'volume_groups': dict(scope.metadata_vgs) or None,
              'interval_seconds': elapsed, 'handles': [], 'transfers': [],
              'leftovers': [], 'unreadable': [], 'warnings': []}
    _unreadable(scope, status_errors or {}, table_errors or {}, report)
    clone_lvs = set()
    for name in sorted(statuses):
        if not _ours(scope, name) or name in (status_errors or {}):
            continue
        parsed = layout.parse_handle(name)
        vg, lv = parsed
        lines = statuses[name]
        handle = {'name': name, 'uuid': uuids.get(name),
                  'volume_group': vg, 'lv_name': lv,
                  'volume_id': _owner(scope, lv, read_owner, report),
                  'table': _table_type(lines),
                  'lv_exists': (vg, lv) in lvs}
        report['handles'].append(handle)
        if handle['uuid'] is not None and not handle['uuid'].startswith(
                layout.HANDLE_UUID_PREFIX):
            report['warnings'].append(
                '%s has dm UUID %r, not one the driver makes (%s...)'
                % (name, handle['uuid'], layout.HANDLE_UUID_PREFIX))
        if not handle['lv_exists']:
            report['leftovers'].append({
                'kind': HANDLE_WITHOUT_LV, 'name': name,
                'volume_group': vg, 'lv_name': lv,
                'hint': 'the LV %s/%s is gone; if no instance uses %s, '
                        'remove it with "dmsetup remove %s"'
                        % (vg, lv, dmsetup.device_path(name), name)})
        if handle['table'] != 'clone':
            continue
        clone_lvs.add((vg, lv))
        metadata = _metadata(report, read_metadata, handle['volume_id'])
        earlier = None
        if second is not None:
            earlier = next((line.clone for line in first.get(name, [])
                            if line.clone is not None), None)
        entry = _transfer(handle, lines, earlier, elapsed,
                          tables.get(name, []), links, metadata,
                          scope.metadata_vgs.get(vg), lvs)
        report['transfers'].append(entry)
        if entry['failed']:
            report['warnings'].append(
                'clone %s reports %s: its source or metadata device '
                'failed; see the operations guide' % (name,
                                                      entry['kernel_state']))
    report['leftovers'] += _metadata_leftovers(scope, lvs, clone_lvs)
    report['leftovers'] += _retiring_leftovers(scope, lvs)
    if read_metadata is not None:
        handled = {(h['volume_group'], h['lv_name'])
                   for h in report['handles']}
        report['leftovers'] += _abandoned_copies(
            scope, lvs, handled, read_metadata, read_host, report,
            read_owner)
    return report


def _metadata(report, read_metadata, vol_id):
    """Admin metadata of a volume, {} when unknown (with a warning)."""
    if read_metadata is None or vol_id is None:
        return {}
    try:
        return read_metadata(vol_id) or {}
    except Exception as exc:
        report['warnings'].append('transfer state of volume %s not read '
                                  'from the database: %s' % (vol_id, exc))
        return {}


def _metadata_leftovers(scope, lvs, clone_lvs):
    """Metadata LVs with no clone target on their volume's handle."""
    leftovers = []
    meta_vgs = set(scope.metadata_vgs.values())
    for vg, name in sorted(lvs):
        lv = layout.lv_name_from_metadata_lv(name)
        if lv is None or not (scope.everything or vg in meta_vgs):
            continue
        owners = scope.data_vgs_for_metadata(vg)
        if any(c_lv == lv and (owners is None or c_vg in owners)
               for c_vg, c_lv in clone_lvs):
            continue
        leftovers.append({
            'kind': METADATA_WITHOUT_CLONE, 'volume_group': vg,
            'lv_name': name,
            'hint': 'normal for a few seconds while a transfer '
                    'finalizes, and after a reboot until the volume '
                    'service has started (its recovery rebuilds the clone '
                    'or finishes the move); if it stays, check the '
                    'dmclone_* admin metadata of the volume before '
                    'removing it'})
    return leftovers


def _abandoned_copies(scope, lvs, handled, read_metadata, read_host,
                      report, read_owner=None):
    """Old copies of moves abandoned as lost, named by their volume.

    Looked for among the data LVs named like a volume's that have no
    handle (a volume living here has one once its service started; the
    old copy never gets one again): one database read each.  The LV
    after a move has the old copy's name on every node, and a key naming
    an old copy outlives its removal: an LV is one only if the record
    names this node as holding it, and neither the volume's record nor
    its current move names this node (:func:`_lives_or_moves_here`).
    When the node's names or the volume's host are unknown, the tool
    advises nothing and says so.  The volume is the one of the id in the
    LV's name, or (with ``read_owner``) the one whose ``_name_id`` it is:
    either way, only a record naming this very LV counts.
    """
    leftovers, unread, unsure = [], [], []
    for vg, name in sorted(lvs):
        vol_id = volume_id(name, scope.name_template)
        if (vol_id is None or (vg, name) in handled
                or not (scope.everything or vg in scope.metadata_vgs)
                or layout.lv_name_from_metadata_lv(name)
                or layout.is_retiring_lv(name)):
            continue
        try:
            vol_id, metadata, nodes = _copy_record(
                scope, name, vol_id, read_metadata, read_owner)
        except Exception as exc:
            unread.append('%s/%s (%s)' % (vg, name, exc))
            continue
        if not nodes:
            continue
        if not scope.node_names or read_host is None:
            unsure.append('%s/%s' % (vg, name))
            continue
        if not scope.node_names & set(nodes):
            continue
        try:
            host = read_host(vol_id)
        except Exception as exc:
            unread.append('%s/%s (%s)' % (vg, name, exc))
            continue
        if _lives_or_moves_here(scope, host, metadata):
            continue
        leftovers.append({
            'kind': ABANDONED_COPY, 'volume_group': vg, 'lv_name': name,
            'volume_id': vol_id, 'nodes': nodes,
            'hint': 'the old copy of volume %s left when its move away '
                    'from %s was abandoned as lost; it may hold the only '
                    'copy of the regions never copied: copy back what is '
                    'needed, then remove it by hand (see "If the lost '
                    'node comes back" in the operations guide)'
                    % (vol_id, ' or '.join(nodes))})
    if unread:
        report['warnings'].append(
            'LVs without a handle not checked for old copies of abandoned '
            'moves: %s' % ', '.join(unread))
    if unsure:
        report['warnings'].append(
            'LVs without a handle that a record names as the old copy of '
            'an abandoned move, on some node; without --config-file and '
            'the database this tool cannot tell whether they are this '
            'node\'s old copies or the live volumes: %s' % ', '.join(unsure))
    return leftovers


def _copy_record(scope, name, vol_id, read_metadata, read_owner):
    """(volume id, its admin metadata, nodes) of the record naming LV ``name``.

    ``nodes`` are those the record says hold ``name`` as an old copy
    (empty: no record does).  With ``read_owner``, the volume whose LV
    the name is now is read first: one whose ``_name_id`` is the id in
    the name, while the volume of that id is the deleted temporary one
    of a generic migration; then the volume of the id in the name.  A
    volume that cannot be read is skipped while another can; if none
    can, the first error is raised.
    """
    candidates = []
    if read_owner is not None:
        owner = read_owner(name)
        if owner is not None:
            candidates.append(owner)
    if vol_id not in candidates:
        candidates.append(vol_id)
    errors = []
    for candidate in candidates:
        try:
            metadata = read_metadata(candidate) or {}
        except Exception as exc:
            errors.append(exc)
            continue
        nodes = sorted(node for node, lv in
                       move.Store.old_copies_of(metadata).items()
                       if lv == name)
        if nodes:
            return candidate, metadata, nodes
    if len(errors) == len(candidates):
        raise errors[0]
    return vol_id, {}, []


def _lives_or_moves_here(scope, host, metadata):
    """True if the volume's host or its current move names this node."""
    named = {(host or '').partition('@')[0]}
    for key in ('source_node', 'dest_node', 'source_host', 'dest_host'):
        value = metadata.get(move.KEY_PREFIX + key) or ''
        named.add(value.partition('@')[0])
    aliases = metadata.get(move.KEY_PREFIX + 'source_aliases') or ''
    named |= set(aliases.split(','))
    return bool(scope.node_names & named)


def _retiring_leftovers(scope, lvs):
    """Old copies renamed to be wiped (see cinder_dmclone.wiper)."""
    vgs = set(scope.metadata_vgs) | set(scope.metadata_vgs.values())
    leftovers = []
    for vg, name in sorted(lvs):
        if not layout.is_retiring_lv(name) or not (scope.everything
                                                   or vg in vgs):
            continue
        leftovers.append({
            'kind': RETIRING, 'volume_group': vg, 'lv_name': name,
            'hint': 'an old copy (after a move, a rollback or a delete) '
                    'that the volume service wipes in the background, then '
                    'removes; a stopped service wipes it again at its next '
                    'start; if it stays while the service runs, the '
                    'service\'s log says why ("Wiping LV %s failed")'
                    % name})
    return leftovers


def collect(args, scope, dm=None, execute=None, sleep=time.sleep,
            clock=time.monotonic, links=None, read_metadata=None,
            read_host=None, read_owner=None):
    """Read the node and build the report (see the module docstring)."""
    execute = execute or processutils.execute
    dm = dm or privileged.DMSetup(execute=execute)
    status_errors, table_errors = {}, {}
    first, second, elapsed = take_samples(dm, args.interval, sleep, clock,
                                          errors=status_errors)
    uuids = dm.uuids()
    tables = dm.tables('clone', errors=table_errors)
    lvs = privileged.list_lvs(scope.lvm_vgs(), execute=execute)
    if links is None:
        links = iscsi_links()
    warnings = []
    if (read_metadata is None and scope.database and not args.no_db
            and args.config_file):
        try:
            read_metadata = database_reader(args.config_file)
            read_host = read_host or host_reader(args.config_file)
            read_owner = read_owner or owner_reader(args.config_file,
                                                    scope.name_template)
        except Exception as exc:
            warnings.append('database not readable, transfer state and '
                            'the monitor\'s rate unknown: %s' % exc)
    report = build_report(scope, first, second, elapsed, uuids, tables,
                          lvs, links, read_metadata, status_errors,
                          table_errors, read_host, read_owner)
    report['warnings'] = warnings + report['warnings']
    return report


# --------------------------------------------------------------------------
# What the commands show
# --------------------------------------------------------------------------

#: the exit status of a command that read the node
EXIT_OK = 0
EXIT_ATTENTION = 1      # leftovers, failed clones or unreadable handles
EXIT_FAILURE = 2        # bad usage, or a command on the node failed

#: errors of the node's commands: the report cannot be made (exit 2)
NODE_ERRORS = (dmc_exception.PrivilegedCommandFailed,
               dmc_exception.DMStatusParseError,
               dmc_exception.InvalidDMName)


def read_node(args, **collect_kwargs):
    """Check the options, then read the node: the report of ``collect``.

    Raises UsageError (bad options, not root) or one of NODE_ERRORS.
    ``collect_kwargs`` replace the node's commands in tests; with an
    ``execute`` of their own the root check is skipped.
    """
    check_args(args)
    if os.geteuid() != 0 and collect_kwargs.get('execute') is None:
        raise UsageError('run as root: the tool reads device-mapper '
                         'and LVM state directly')
    return collect(args, scope_from_args(args), **collect_kwargs)


def size_text(value):
    """Bytes for a human: '4.0 MiB', '-' when unknown."""
    if value is None:
        return '-'
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if value < 1024 or unit == 'GiB':
            return '%.1f %s' % (value, unit)
        value /= 1024.0


def duration_text(seconds):
    """Seconds for a human: '59s', '1m05s', '2h00m', '-' when unknown."""
    if seconds is None:
        return '-'
    seconds = int(round(seconds))
    if seconds >= 3600:
        return '%dh%02dm' % (seconds // 3600, seconds % 3600 // 60)
    if seconds >= 60:
        return '%dm%02ds' % (seconds // 60, seconds % 60)
    return '%ds' % seconds


def transfer_state(transfer):
    """(state, notes) of a transfer entry.

    The state is the ``dmclone_state`` of the database when it was read,
    else what the kernel tells: ``hydrating`` or ``hydration off`` (None
    for a failed clone).  The notes are what an operator must know
    besides: no progress for a while, a stale attachment on the source.
    """
    if transfer['failed']:
        return transfer['state'], []
    state = transfer['state'] or ('hydrating' if transfer['hydration_enabled']
                                  else 'hydration off')
    notes = []
    if transfer.get('stalled_seconds'):
        # The monitor saw no region copied for that long: the path to
        # the source is the first suspect.
        notes.append('no progress for %s'
                     % duration_text(transfer['stalled_seconds']))
    if transfer.get('stale_source_attachment'):
        # Kept after writes here: an operator deletes the stale attachment
        # on the source (see operations.rst).
        notes.append('waits: delete the stale attachment on %s'
                     % transfer['stale_source_attachment'])
    if transfer.get('awaiting_source'):
        # The source's attachment is gone, but the source has not
        # confirmed that nothing there holds its copy (see operations.rst).
        notes.append('waits: %s to confirm its copy is closed'
                     % transfer['awaiting_source'])
    return state, notes


def transfer_state_text(transfer):
    """The state with its notes, as the tables show it."""
    state, notes = transfer_state(transfer)
    return ''.join([state or '-'] + [' (%s)' % note for note in notes])


def transfer_source(transfer):
    """Where the transfer reads from: node, else portal, else device."""
    return (transfer['source_node'] or transfer['source_portal']
            or transfer['source_device'])


def transfer_progress_text(transfer):
    """'512/1024 (50.0%)', or 'FAILED (<kernel state>)'."""
    if transfer['failed']:
        return 'FAILED (%s)' % transfer['kernel_state']
    return '%d/%d (%.1f%%)' % (transfer['hydrated_regions'],
                               transfer['total_regions'],
                               transfer['percent'])


def transfer_line(transfer):
    """One line per transfer: volume, state, source, progress, rate, ETA."""
    line = '%s: %s from %s, %s' % (
        transfer['volume_id'] or transfer['handle'],
        transfer_state_text(transfer), transfer_source(transfer) or '-',
        transfer_progress_text(transfer))
    if not transfer['failed']:
        rate = transfer['rate_bps']
        line += ', %s, ETA %s' % (
            '-' if rate is None else size_text(rate) + '/s',
            duration_text(transfer['eta_seconds']))
    return line


def leftover_name(item):
    """The handle of a handle without LV, the LV of the others."""
    return item.get('name') or item['lv_name']


def handles_summary(handles):
    """'3: 2 linear, 1 clone; 1 without LV' ('0' for none)."""
    if not handles:
        return '0'
    tables = {}
    for handle in handles:
        tables[handle['table']] = tables.get(handle['table'], 0) + 1
    text = '%d: %s' % (len(handles), ', '.join(
        '%d %s' % (count, table) for table, count in sorted(
            tables.items(), key=lambda item: (-item[1], item[0]))))
    missing = sum(1 for handle in handles if not handle['lv_exists'])
    if missing:
        text += '; %d without LV' % missing
    return text


def _count(number, singular, plural):
    return '%d %s' % (number, singular if number == 1 else plural)


def health(report):
    """'ok', or 'attention: ...' naming what needs a look (see exit_code)."""
    leftovers = [item for item in report['leftovers']
                 if item['kind'] != RETIRING]
    retiring = len(report['leftovers']) - len(leftovers)
    failed = sum(1 for t in report['transfers'] if t['failed'])
    problems = []
    if leftovers:
        problems.append(_count(len(leftovers), 'leftover', 'leftovers'))
    if failed:
        problems.append(_count(failed, 'failed clone', 'failed clones'))
    if report['unreadable']:
        problems.append(_count(len(report['unreadable']),
                               'unreadable handle', 'unreadable handles'))
    text = 'attention: ' + ', '.join(problems) if problems else 'ok'
    if retiring:
        text += ' (%s)' % _count(retiring, 'old copy being wiped',
                                 'old copies being wiped')
    return text


def exit_code(report):
    """EXIT_ATTENTION when something needs an operator's look, else 0.

    An old copy being wiped (``retiring_lv``) is the volume service's
    normal work after a move, a rollback or a delete: it is listed, but
    does not make the status 1 by itself.
    """
    failed = any(t['failed'] for t in report['transfers'])
    leftovers = any(item['kind'] != RETIRING
                    for item in report['leftovers'])
    return EXIT_ATTENTION if (leftovers or failed
                              or report.get('unreadable')) else EXIT_OK
