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

"""``cinder-dmclone``: the operators' command, built on cliff.

One command with subcommands, as OpenStack's own command lines are::

    cinder-dmclone status          the node at a glance (exit status 0/1/2)
    cinder-dmclone handle list     the volume handles
    cinder-dmclone move list       the moves into this node, with progress
    cinder-dmclone leftover list   what a crash or a stopped service left
    cinder-dmclone move abandon-source VOLUME
                                   end a move whose source is lost for good

Every command takes cliff's output options (``-f table|json|yaml|value``,
``csv`` for the lists, ``shell`` for ``status``; ``-c COLUMN``).  Tables
show values for humans (``4.0 MiB/s``, ``1h02m``); json and yaml give the
numbers (bytes per second, seconds).  The commands show parts of one
report, computed by :mod:`cinder_dmclone.cmd.status`; the classes here only
choose and name the columns.

Commands are found through the entry point namespace ``cinder_dmclone.cli``
(``setup.cfg``).  Run from a source tree that is not installed (the
testbed puts the tree on ``PYTHONPATH``), that namespace is empty: the
application then adds the commands of :data:`COMMANDS` itself, so the
table in ``setup.cfg`` and :data:`COMMANDS` must agree (a unit test
checks).  A new command is one class here (a subclass of
:class:`NodeCommand` when it reads the node, of :class:`ExitStatus` and a
cliff command otherwise), added to :data:`COMMANDS` and to ``setup.cfg``.

Exit status: ``status`` exits 1 when something needs an operator's look
(:func:`cinder_dmclone.cmd.status.exit_code`); every command exits 2 on
bad usage or when it fails (cliff's own 1 for a failed command is never
used: 1 means "look at this node").

``cinder-dmclone-status`` is the former tool's name, kept for one release
as a deprecated alias of ``cinder-dmclone status``.
"""

import importlib.metadata
import logging
import os
import sys
import traceback

from cliff import app
from cliff import columns
from cliff import commandmanager
from cliff import lister
from cliff import show

from cinder_dmclone.cmd import abandon
from cinder_dmclone.cmd import status
from cinder_dmclone import dmsetup

NAME = 'cinder-dmclone'
NAMESPACE = 'cinder_dmclone.cli'
DISTRIBUTION = 'cinder-dmclone'


# --------------------------------------------------------------------------
# Values: one for machines, a text for humans
# --------------------------------------------------------------------------

class Shown(columns.FormattableColumn):
    """A value as json/yaml/value/csv give it, and the text tables show."""

    def __init__(self, value, text):
        super().__init__(value)
        self._text = text

    def human_readable(self):
        return self._text


def optional(value):
    """A value that may be unknown: '-' in tables, null in json."""
    return Shown(value, '-' if value is None else str(value))


def rate(value):
    return Shown(value, '-' if value is None
                 else status.size_text(value) + '/s')


def duration(value):
    return Shown(value, status.duration_text(value))


def lines(items, line, empty='none'):
    """A list: one line per item in tables, the list itself for machines."""
    return Shown(items, '\n'.join(line(item) for item in items) or empty)


# --------------------------------------------------------------------------
# Base classes
# --------------------------------------------------------------------------

class ExitStatus(object):
    """Mix-in: the exit statuses of cinder-dmclone (see the module doc).

    Bad usage and failures are reported on stderr in one line and exit 2
    (with ``--debug``, with the traceback).  A command that reads the node
    sets ``exit_status``; a plain cliff Command may return it from
    ``take_action``.
    """

    exit_status = status.EXIT_OK

    def run(self, parsed_args):
        try:
            code = super().run(parsed_args)
        except Exception as exc:
            # status.UsageError and status.NODE_ERRORS mostly; also cliff
            # refusing an option value (-c NOSUCH), or a bug: never the 1
            # that means "look at this node".
            return self._failed(exc)
        return code or self.exit_status

    def _failed(self, exc):
        if getattr(self.app.options, 'debug', False):
            traceback.print_exc(file=self.app.stderr)
        self.app.stderr.write('%s: %s\n' % (NAME, exc))
        return status.EXIT_FAILURE


class NodeCommand(ExitStatus):
    """Mix-in for commands that read this node: scope options, the report.

    ``measures`` adds ``--interval`` and ``--no-db`` (rate, ETA and the
    transfer state); without it the report is read in one sample and
    without the database.
    """

    measures = False

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        group = parser.add_argument_group('what to look at')
        group.add_argument(
            '--config-file', metavar='PATH',
            help='cinder.conf to read the backend sections (volume_group, '
                 'dmclone_metadata_volume_group) and the database '
                 'connection from.')
        group.add_argument(
            '--backend', action='append', metavar='SECTION',
            help='Backend section(s) of --config-file to look at (default: '
                 'every enabled backend whose volume_driver is this '
                 'driver).')
        group.add_argument(
            '--volume-group', action='append', metavar='VG',
            help='A data volume group to look at, instead of --config-file '
                 '(repeatable; default: every volume group).')
        group.add_argument(
            '--metadata-volume-group', metavar='VG',
            help='The metadata volume group of the --volume-group(s) '
                 '(default: the same VG).')
        if self.measures:
            group.add_argument(
                '--interval', type=float, default=2.0, metavar='SECONDS',
                help='Seconds between the two status samples that measure '
                     'the hydration rate; 0 takes one sample only (default: '
                     '%(default)s). The second sample is only taken while a '
                     'clone is hydrating.')
            group.add_argument(
                '--no-db', action='store_true',
                help='Do not read the transfer state from the database even '
                     'if --config-file names one.')
        else:
            parser.set_defaults(interval=0.0, no_db=True)
        return parser

    def read_node(self, parsed_args):
        """The report (see cinder_dmclone.cmd.status.collect)."""
        hooks = getattr(self.app, 'node_hooks', None) or {}
        return status.read_node(parsed_args, **hooks)


class NodeLister(NodeCommand, lister.Lister):
    """A list of one part of the report; ``--long`` shows every column.

    A subclass names its ``columns`` and ``long_columns`` and defines
    ``items(report)``, the entries to list, and ``row(item)``, the
    {column: value} of one entry (every column, --long's too).
    """

    #: the columns shown by default, then those added by --long
    columns = ()
    long_columns = ()

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('--long', action='store_true',
                            help='Show every column.')
        return parser

    def take_action(self, parsed_args):
        report = self.read_node(parsed_args)
        names = self.columns + (self.long_columns if parsed_args.long
                                else ())
        rows = [self.row(item) for item in self.items(report)]
        return names, [tuple(row[name] for name in names) for row in rows]


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------

def _volume_groups_text(volume_groups):
    if not volume_groups:
        return 'every volume group'
    return '\n'.join(vg if meta == vg else '%s (metadata in %s)' % (vg, meta)
                     for vg, meta in sorted(volume_groups.items()))


class Status(NodeCommand, show.ShowOne):
    """Show this node at a glance: handles, moves in, leftovers, warnings.

    Exit status 0 when all is well, 1 when leftovers, failed clones or
    unreadable handles need a look, 2 on bad usage or a failed command.
    -f json gives the whole report: every handle, move and leftover.
    """

    command_name = 'status'
    measures = True

    def take_action(self, parsed_args):
        report = self.read_node(parsed_args)
        self.exit_status = status.exit_code(report)
        interval = report['interval_seconds']
        fields = (
            ('health', status.health(report)),
            ('volume_groups', Shown(
                report['volume_groups'],
                _volume_groups_text(report['volume_groups']))),
            ('interval_seconds', Shown(
                interval, '- (one sample)' if interval is None
                else '%.1f' % interval)),
            ('handles', Shown(report['handles'],
                              status.handles_summary(report['handles']))),
            ('transfers', lines(report['transfers'], status.transfer_line)),
            ('leftovers', lines(report['leftovers'], lambda item: '%s %s/%s'
                                % (item['kind'], item['volume_group'],
                                   status.leftover_name(item)))),
            ('unreadable', lines(report['unreadable'], lambda item: '%s: %s'
                                 % (item['name'], item['reason']))),
            ('warnings', lines(report['warnings'], str)),
        )
        return tuple(zip(*fields))


class HandleList(NodeLister):
    """List the volume handles (dmclone-* devices) of this node."""

    command_name = 'handle list'
    columns = ('Handle', 'Volume', 'Table', 'LV')
    long_columns = ('Volume Group', 'LV Name', 'UUID')

    def items(self, report):
        return report['handles']

    def row(self, handle):
        return {
            'Handle': handle['name'],
            'Volume': optional(handle['volume_id']),
            'Table': handle['table'],
            'LV': Shown(handle['lv_exists'],
                        'ok' if handle['lv_exists'] else 'MISSING'),
            'Volume Group': handle['volume_group'],
            'LV Name': handle['lv_name'],
            'UUID': optional(handle['uuid']),
        }


class MoveList(NodeLister):
    """List the moves into this node: state, source, progress, rate, ETA."""

    command_name = 'move list'
    measures = True
    columns = ('Volume', 'State', 'Source', 'Progress', 'Rate', 'ETA')
    long_columns = ('Handle', 'Hydration', 'Hydrated Regions',
                    'Total Regions', 'Hydrating Regions', 'Region Bytes',
                    'Rate Source', 'Stalled Seconds',
                    'Stale Source Attachment', 'Source Node',
                    'Source Device', 'Source Portal', 'Source IQN',
                    'Metadata LV', 'Metadata LV Exists', 'Failed',
                    'Kernel State')

    def items(self, report):
        return report['transfers']

    def row(self, t):
        state, _notes = status.transfer_state(t)
        enabled = t.get('hydration_enabled')
        return {
            'Volume': t['volume_id'] or t['handle'],
            'State': Shown(state, status.transfer_state_text(t)),
            'Source': optional(status.transfer_source(t)),
            'Progress': Shown(t.get('percent'),
                              status.transfer_progress_text(t)),
            'Rate': rate(t.get('rate_bps')),
            'ETA': duration(t.get('eta_seconds')),
            'Handle': t['handle'],
            'Hydration': Shown(enabled, '-' if enabled is None
                               else 'on' if enabled else 'off'),
            'Hydrated Regions': optional(t.get('hydrated_regions')),
            'Total Regions': optional(t.get('total_regions')),
            'Hydrating Regions': optional(t.get('hydrating_regions')),
            'Region Bytes': optional(t.get('region_bytes')),
            'Rate Source': optional(t.get('rate_source')),
            'Stalled Seconds': duration(t.get('stalled_seconds')),
            'Stale Source Attachment': optional(
                t.get('stale_source_attachment')),
            'Awaiting Source': optional(t.get('awaiting_source')),
            'Source Node': optional(t['source_node']),
            'Source Device': optional(t['source_device']),
            'Source Portal': optional(t['source_portal']),
            'Source IQN': optional(t['source_iqn']),
            'Metadata LV': Shown(t['metadata_lv'], '%s/%s' % (
                t['metadata_volume_group'] or '?', t['metadata_lv'])),
            'Metadata LV Exists': optional(t['metadata_lv_exists']),
            'Failed': t['failed'],
            'Kernel State': optional(t.get('kernel_state')),
        }


class LeftoverList(NodeLister):
    """List what a crash or a stopped service left on this node, and why.

    Kinds: metadata_lv_without_clone, handle_without_lv, retiring_lv
    (an old copy being wiped: normal while the volume service runs), and
    with the database abandoned_copy (the old copy a move abandoned as
    lost left on this node: removed by hand).
    """

    command_name = 'leftover list'
    columns = ('Kind', 'Volume Group', 'Name', 'Hint')
    long_columns = ('LV Name',)

    def items(self, report):
        return report['leftovers']

    def row(self, item):
        return {
            'Kind': item['kind'],
            'Volume Group': item['volume_group'],
            'Name': status.leftover_name(item),
            'Hint': item['hint'],
            'LV Name': item['lv_name'],
        }


#: lines of ranges a table shows (json, yaml and value give them all)
RANGE_LINES = 20


def _ranges_text(outcome):
    tokens = [dmsetup.ranges_text([r]) for r in outcome.ranges]
    if len(tokens) > RANGE_LINES:
        tokens = tokens[:RANGE_LINES] + [
            '... %d more (see ranges_file)' % (len(tokens) - RANGE_LINES)]
    return '\n'.join(tokens) or 'none'


class MoveAbandonSource(ExitStatus, show.ShowOne):
    """End a move whose source node is lost for good (run on its destination).

    The regions never copied from the source are found, zeroed and listed;
    the clone is replaced by a plain mapping of the volume's LV here, the
    volume goes to status "error", and its admin metadata records the loss
    (dmclone_lost_*). Refused, changing nothing, unless the move is this
    node's and cloned or hydrating, and the source's volume service is
    reported down with no iSCSI session to it logged in. Safe to run
    again after a failure: it finishes what it started. What the lost node
    still holds (the volume's old LV, not wiped, and its iSCSI target) is
    listed under left_on_source, for an operator to remove by hand if the
    node ever comes back.
    """

    command_name = 'move abandon-source'

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument('volume_id', metavar='VOLUME_ID',
                            help='The volume whose move into this node lost '
                                 'its source.')
        parser.add_argument(
            '--config-file', action='append', metavar='PATH',
            help='cinder.conf of this node\'s volume service (repeatable, '
                 'in the order the service reads them; default: %s): the '
                 'database, the coordination backend, the backend section '
                 'and the state_path (the list of lost ranges goes to '
                 '<state_path>/dmclone/).' % abandon.DEFAULT_CONFIG)
        parser.add_argument(
            '--backend', metavar='SECTION',
            help='The backend section of this driver (default: the one '
                 'enabled backend whose volume_driver is this driver).')
        parser.add_argument(
            '--force', action='store_true',
            help='DANGEROUS: abandon the source even though its volume '
                 'service reports up or its iSCSI session is logged in. '
                 'Every region not copied yet is then zeroed although the '
                 'source may still hold it, and a source that is alive '
                 'keeps exporting its stale copy.')
        return parser

    def take_action(self, parsed_args):
        hooks = getattr(self.app, 'node_hooks', None) or {}
        factory = hooks.get('lost_source')
        if factory is None:
            if os.geteuid() != 0:
                raise status.UsageError(
                    'run as root: the command reads and writes the volume\'s '
                    'devices directly')
            factory = abandon.from_config
        command, close = factory(parsed_args)
        try:
            outcome = command.run(parsed_args.volume_id,
                                  force=parsed_args.force)
        finally:
            close()
        left = outcome.left_on_source
        fields = (
            ('volume_id', outcome.volume_id),
            ('status', outcome.status),
            ('source_node', outcome.source_node),
            ('uncopied_regions', Shown(
                outcome.uncopied_regions, '%d of %d (%s)' % (
                    outcome.uncopied_regions, outcome.total_regions,
                    status.size_text(outcome.uncopied_bytes)))),
            ('total_regions', outcome.total_regions),
            ('region_bytes', outcome.region_bytes),
            ('uncopied_bytes', outcome.uncopied_bytes),
            ('uncopied_ranges', Shown(
                [{'offset': o, 'length': n} for o, n in outcome.ranges],
                _ranges_text(outcome))),
            ('ranges_file', outcome.ranges_file),
            ('left_on_source', Shown(left, (
                'on %s, if it ever comes back: LV %s (not wiped) and iSCSI '
                'target %s (%s); nothing describes them any more: remove '
                'them by hand' % (left['node'], left['lv'],
                                  left['target_iqn'],
                                  left['target_portal'])))),
        )
        return tuple(zip(*fields))


#: the commands, as setup.cfg registers them in NAMESPACE
COMMANDS = (Status, HandleList, MoveList, LeftoverList, MoveAbandonSource)


# --------------------------------------------------------------------------
# The application
# --------------------------------------------------------------------------

class CommandManager(commandmanager.CommandManager):
    """The commands of NAMESPACE, and COMMANDS when not installed."""

    def __init__(self, namespace=NAMESPACE):
        super().__init__(namespace)
        for cls in COMMANDS:
            if cls.command_name not in self.commands:
                self.add_command(cls.command_name, cls)


def version():
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return 'unknown (not installed)'


class DMCloneApp(app.App):
    """The cinder-dmclone application.

    ``node_hooks`` replace the node's commands and clock in tests (see
    :func:`cinder_dmclone.cmd.status.collect`).
    """

    NAME = NAME

    def __init__(self, stdout=None, stderr=None, **node_hooks):
        self.node_hooks = node_hooks
        self._no_command = False
        super().__init__(
            description='Operator commands of the cinder-dmclone volume '
                        'driver: run them as root on a node.',
            version=version(), command_manager=CommandManager(),
            stdout=stdout, stderr=stderr, deferred_help=True)

    def build_option_parser(self, description, version,
                            argparse_kwargs=None):
        argparse_kwargs = dict(argparse_kwargs or {}, prog=NAME)
        return super().build_option_parser(description, version,
                                           argparse_kwargs)

    def configure_logging(self):
        # oslo.log leaves a bare handler to stderr on the root logger
        # until logging is set up (cinder's config module registers its
        # options on import); at the DEBUG level cliff gives the root
        # logger it would print every debug line.  cliff's own console
        # handler (-v, -q) takes its place.
        root = logging.getLogger()
        for handler in list(root.handlers):
            if (type(handler) is logging.StreamHandler
                    and handler.stream is sys.stderr):
                root.removeHandler(handler)
        super().configure_logging()

    def interact(self):
        # No interactive shell: without a command, say so (exit 2).
        self._no_command = True
        self.stderr.write('%s: no command given; "%s help" lists them\n'
                          % (NAME, NAME))

    def run(self, argv):
        code = super().run(argv)
        return status.EXIT_FAILURE if self._no_command else code


def main(argv=None, **node_hooks):
    """Entry point of ``cinder-dmclone``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return DMCloneApp(**node_hooks).run(argv)


DEPRECATION = ('cinder-dmclone-status is deprecated and will be removed: '
               'use "cinder-dmclone status" (the same options, -f json '
               'instead of --json)')


def status_alias(argv=None, **node_hooks):
    """Entry point of ``cinder-dmclone-status``: ``cinder-dmclone status``.

    Deprecated: says so on stderr in one line.  Its former ``--json`` is
    ``-f json``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    sys.stderr.write(DEPRECATION + '\n')
    args = []
    for arg in argv:
        args += ['-f', 'json'] if arg == '--json' else [arg]
    return main(['status'] + args, **node_hooks)


if __name__ == '__main__':
    sys.exit(main())
