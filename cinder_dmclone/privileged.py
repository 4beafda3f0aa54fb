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

"""Every command cinder-dmclone builds to run as root.

No other module of the package runs a command (a unit test checks it).
Here are:

* :class:`DMSetup`: ``dmsetup`` (handles and clone targets) and
  ``blockdev --getsz``, with tables and results built and parsed by the
  pure :mod:`cinder_dmclone.dmsetup`;
* :func:`zero_metadata_head`: ``dd`` zeroing the head of a clone's
  metadata LV, so that dm-clone formats it;
* :func:`load_module`: ``modprobe dm_clone``;
* :func:`lio_openers`, :func:`lio_acls`: not commands, LIO's backstores
  and node ACLs read from configfs (world-readable), to tell LIO's
  opener of a device from an instance's and to see which nodes an
  export admits;
* :func:`thin_lvs`: ``lvs`` of a volume group's thin pool and thin LVs
  (their data and metadata usage), parsed by the pure
  :mod:`cinder_dmclone.thin`; :func:`vg_lv_names`, the same command
  read for the names of every LV of the group, a failure never taken
  for an empty group;
* :func:`thin_device`, :func:`reserve_metadata_snap`,
  :func:`release_metadata_snap`, :func:`thin_dump`: what a thin LV maps
  (its thin id, a metadata snapshot of its pool and ``thin_dump`` of
  it, read as it comes by :func:`stream_output` and never past a byte
  cap), :func:`thin_table`: the thin LV's own table (no external
  origin), :func:`thin_mapped_sectors` and :func:`pool_block_sectors`:
  how much it maps, in how large blocks (what bounds its dump),
  :func:`pool_zeroes`: whether a pool zeroes new blocks (its thin-pool
  table), and :func:`discard_regions`: ``blkdiscard`` of whole regions
  of a clone (see doc/source/contributor/thin-map.rst);
* :func:`list_lvs`: the ``lvs`` of the operator command
  ``cinder-dmclone`` (which runs as root itself, without rootwrap);
* :func:`probe_regions`, :func:`zero_ranges`,
  :func:`iscsi_session_states`: not commands either, the direct I/O and
  sysfs reads of ``cinder-dmclone move abandon-source`` (root itself;
  the volume service never runs them, so no rootwrap filter admits
  them).

The driver's other LVM commands go through Cinder's
``cinder.brick.local_dev.lvm`` (which reads no pool's metadata usage),
LIO through Cinder's target helper, the wiping of old copies through
Cinder's ``volume_utils.clear_volume`` and iSCSI logins through os-brick
(privsep): Cinder and os-brick build those command lines, not this
project.

Every command runs as ``/usr/bin/env LC_ALL=C <command> ...`` (see
:data:`ENV_PREFIX`) through ``execute`` (Cinder's ``utils.execute`` unless
a caller passes another), the driver's with the root helper, so that
rootwrap's filters (``etc/cinder/rootwrap.d/dmclone.filters``) admit each
by its exact shape.  Every argument is checked here before it can reach
a command line.  A failure raises
:class:`~cinder_dmclone.exception.PrivilegedCommandFailed`, or the
subclass its exit status and one exact line of its output identify
(:class:`Known`); never a guess from a substring of arbitrary text.
"""

import dataclasses
import errno
import fcntl
import glob
import mmap
import os
import re
import shlex
import signal
import stat
import struct
import subprocess
import tempfile

from oslo_concurrency import processutils
from oslo_log import log as logging

from cinder import utils

from cinder_dmclone import dmsetup
from cinder_dmclone import exception
from cinder_dmclone import layout
from cinder_dmclone import thin

LOG = logging.getLogger(__name__)

#: Every command runs under ``/usr/bin/env LC_ALL=C``: the messages
#: recognised below are the commands' untranslated ones, and an
#: environment variable set in this process would not reach a command
#: started through sudo and rootwrap.  The absolute path keeps the rootwrap
#: filters exact: oslo.rootwrap's EnvFilter (Cinder's, for LVM) admits any
#: arguments after the command, and while matching it strips a leading
#: bare ``env`` from the command line, so a filter of ours expecting
#: ``env`` would never match once Cinder's volume.filters had been read
#: first.
ENV_PREFIX = ('/usr/bin/env', 'LC_ALL=C')


# --------------------------------------------------------------------------
# Running a command, classifying its failure
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Known:
    """A failure told by its exit status and one exact line of output.

    ``line`` must match a whole line of standard output or standard error
    (stripped of surrounding white space); ``error`` is the exception
    class raised for it.
    """

    exit_code: int
    line: re.Pattern
    error: type

    def matches(self, failure):
        if failure.exit_code != self.exit_code:
            return False
        text = '%s\n%s' % (failure.stdout or '', failure.stderr or '')
        return any(self.line.fullmatch(line.strip())
                   for line in text.splitlines())


def _exactly(text):
    """A pattern matching ``text`` and nothing else."""
    return re.compile(re.escape(text))


#: cinder-rootwrap's exit status when no filter admits a command line.
ROOTWRAP_UNAUTHORIZED = 99


def _refused(argv, error):
    """rootwrap's refusal of exactly this command line.

    rootwrap prints ``<its name>: Unauthorized command: <the command line>
    (no filter matched)`` and exits 99, a status none of these commands
    uses itself.
    """
    return Known(ROOTWRAP_UNAUTHORIZED, re.compile(
        r'[A-Za-z0-9_.-]+: Unauthorized command: %s \(no filter matched\)'
        % re.escape(' '.join(str(a) for a in argv))), error)


def _run(command, *args, execute=None, root_helper=None, known=(),
         failed=exception.PrivilegedCommandFailed,
         refused=exception.CommandRefused, **kwargs):
    """Run ``command args`` under LC_ALL=C; (stdout, stderr).

    As root unless the caller passes ``run_as_root=False`` (a caller that
    is root itself).  A failure raises the ``error`` of the first of
    ``known`` it matches, ``refused`` when rootwrap refused the command
    line, and ``failed`` otherwise, also when the command could not be
    started at all (no such executable, no permission).
    """
    kwargs.setdefault('run_as_root', True)
    if root_helper:
        kwargs.setdefault('root_helper', root_helper)
    execute = execute or utils.execute
    argv = ENV_PREFIX + (command,) + args
    cmdline = ' '.join([command] + [str(a) for a in args])
    try:
        return execute(*argv, **kwargs)
    except processutils.ProcessExecutionError as exc:
        raise _typed_error(exc, argv, cmdline, known, failed, refused) \
            from exc
    except OSError as exc:
        raise failed(command=cmdline, exit_code=None, reason=str(exc)) \
            from exc


def _typed_error(exc, argv, cmdline, known, failed, refused):
    """The typed error of a command that failed: ``known``'s, or refused.

    The first of ``known`` (then the root helper's refusal of ``argv``)
    that matches ``exc`` names the error class; ``failed`` otherwise.
    """
    error = failed
    for candidate in tuple(known) + (_refused(argv, refused),):
        if candidate.matches(exc):
            error = candidate.error
            break
    return error(command=cmdline, exit_code=exc.exit_code,
                 reason=(exc.stderr or exc.stdout or str(exc)).strip())


def _run_streamed(command, *args, max_bytes, stream=None, execute=None,
                  root_helper=None, known=(),
                  failed=exception.PrivilegedCommandFailed,
                  refused=exception.CommandRefused, too_large=None):
    """Run ``command args`` as root under LC_ALL=C; yield its output.

    Pieces of bytes as ``stream`` (:func:`stream_output` unless given)
    yields them, never more than ``max_bytes`` in all: the piece that
    passes the cap is not yielded, the runner is closed (which stops
    the command) and ``too_large()`` is raised.  Without ``stream`` but
    with ``execute`` (a caller that runs its commands its own way), the
    whole output of ``execute`` is cut in pieces and capped alike; only
    :func:`stream_output` keeps the memory bounded.  Failures as
    :func:`_run`'s, once the output has ended.
    """
    argv = ENV_PREFIX + (command,) + args
    cmdline = ' '.join([command] + [str(a) for a in args])
    if stream is None:
        stream = stream_output if execute is None else _pieces_of(execute)
    pieces = stream(*argv, run_as_root=True, root_helper=root_helper)
    total = 0
    try:
        for piece in pieces:
            total += len(piece)
            if total > max_bytes:
                raise too_large()
            yield piece
    except processutils.ProcessExecutionError as exc:
        raise _typed_error(exc, argv, cmdline, known, failed, refused) \
            from exc
    except OSError as exc:
        raise failed(command=cmdline, exit_code=None, reason=str(exc)) \
            from exc
    finally:
        close = getattr(pieces, 'close', None)
        if close is not None:
            close()


def _pieces_of(execute):
    """A runner as :func:`stream_output` over ``execute``'s whole output."""
    def stream(*argv, **kwargs):
        out, _err = execute(*argv, **kwargs)
        if isinstance(out, str):
            out = out.encode()
        for i in range(0, len(out), STREAM_PIECE):
            yield out[i:i + STREAM_PIECE]
    return stream


# --------------------------------------------------------------------------
# A command whose output is read as it comes
# --------------------------------------------------------------------------

#: Bytes of a streamed command's output read at a time.
STREAM_PIECE = 1 << 20

#: Bytes of a streamed command's standard error kept for its failure.
STDERR_KEPT = 64 * 1024

#: Seconds a streamed command that is no longer read has to end.
STOP_TIMEOUT = 10


def _default_sigpipe():
    # (Python ignores SIGPIPE; the command must die of it, as rootwrap
    # makes its own command do.)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def stream_output(*argv, run_as_root=False, root_helper=None,
                  piece=STREAM_PIECE, popen=subprocess.Popen):
    """Run ``argv``; yield its standard output in pieces of bytes.

    The streaming counterpart of ``execute`` (oslo's ``processutils``
    reads a command's whole output into memory, and rootwrap offers no
    other way): ``root_helper`` (``sudo cinder-rootwrap ...``) goes in
    front as there (not for a process that is root already), so
    rootwrap's filters admit the same command lines.  Each piece is at
    most ``piece`` bytes; standard error goes to a temporary file.  A
    non-zero exit raises
    ``processutils.ProcessExecutionError`` (its standard error, the
    first :data:`STDERR_KEPT` bytes) once the output has ended.

    Closing the generator before the end stops the command: its pipe is
    closed, so its next write ends it with SIGPIPE (rootwrap gives its
    command SIGPIPE's default action), and it is sent SIGTERM, which
    sudo passes on (a process of root's that this one may not signal is
    left to the pipe).  Under eventlet, ``subprocess`` is green: reading
    a piece blocks only this green thread.
    """
    cmd = [str(a) for a in argv]
    # (As processutils.execute: a process that is root already, the
    # operator's command, runs it itself, needing no sudo.)
    if run_as_root and os.geteuid() != 0:
        if not root_helper:
            raise processutils.NoRootWrapSpecified(
                message='a command run as root needs a root helper')
        cmd = shlex.split(root_helper) + cmd
    with tempfile.TemporaryFile() as err:
        proc = popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=err, close_fds=True, preexec_fn=_default_sigpipe)
        ended = False
        try:
            while True:
                data = proc.stdout.read(piece)
                if not data:
                    break
                yield data
            proc.stdout.close()
            code = proc.wait()
            ended = True
        finally:
            if not ended:
                _stop(proc, cmd)
        if code:
            err.seek(0)
            raise processutils.ProcessExecutionError(
                exit_code=code, stdout='',
                stderr=err.read(STDERR_KEPT).decode(errors='replace'),
                cmd=' '.join(cmd))


def _stop(proc, cmd):
    """End a command whose output is no longer read."""
    proc.stdout.close()
    try:
        proc.terminate()
    except OSError:
        pass
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        LOG.warning('%s did not end within %d s of its output being '
                    'closed; it ends at its next write.', ' '.join(cmd),
                    STOP_TIMEOUT)


# --------------------------------------------------------------------------
# dmsetup and blockdev
# --------------------------------------------------------------------------

#: dmsetup's exit status when a command failed (``Command failed.``).
DMSETUP_FAILED = 1
#: What dmsetup prints (under LC_ALL=C) for a device that is not there:
#: ``info``/``status``/``table`` see a device that does not exist (``info``
#: on standard output), the other commands get ENXIO from their ioctl on
#: that name (on standard error).  Anything else (rootwrap's "Executable
#: not found", a kernel without device-mapper, a command that could not
#: start) is a real failure and must not pass for an absent device.
DM_NOT_FOUND = (
    Known(DMSETUP_FAILED, re.compile(r'Device does not exist\.'),
          exception.DMDeviceNotFound),
    Known(DMSETUP_FAILED,
          re.compile(r'device-mapper: [a-z_]+ ioctl on .* failed: '
                     r'No such device or address'),
          exception.DMDeviceNotFound),
)


class DMSetup(object):
    """The ``dmsetup`` and ``blockdev`` commands of the driver.

    Every call runs as root under ``LC_ALL=C`` (see :func:`_run`),
    tables are fed on standard input (so multi-segment tables need no
    quoting), and a failure becomes
    :class:`~cinder_dmclone.exception.DMSetupCommandFailed` carrying the
    command's message:
    :class:`~cinder_dmclone.exception.DMDeviceNotFound` for a device that
    is not there, :class:`~cinder_dmclone.exception.DMSetupCommandRefused`
    for a command line rootwrap refuses.
    """

    def __init__(self, execute=None, root_helper=None):
        self._execute = execute or utils.execute
        self._root_helper = root_helper

    def _exec(self, command, *args, known=(), **kwargs):
        return _run(command, *args, execute=self._execute,
                    root_helper=self._root_helper, known=known,
                    failed=exception.DMSetupCommandFailed,
                    refused=exception.DMSetupCommandRefused, **kwargs)

    def _run(self, *args, **kwargs):
        return self._exec('dmsetup', *args, known=DM_NOT_FOUND, **kwargs)

    #: attempts of a command over every device (see _run_listing)
    LISTING_ATTEMPTS = 3

    def _run_listing(self, *args):
        """A command over every device, again if one vanished meanwhile.

        ``dmsetup status`` (or ``table``, ``info``) without a name lists
        the devices, then asks the kernel about each; a device removed in
        between (another service's detach, a finished move) fails the
        whole command with "Device does not exist".  The next listing no
        longer holds that device.
        """
        for attempt in range(1, self.LISTING_ATTEMPTS + 1):
            try:
                return self._run(*args)
            except exception.DMDeviceNotFound as exc:
                if attempt == self.LISTING_ATTEMPTS:
                    raise
                LOG.debug('A device went away during %s; listing again.',
                          exc)

    def create(self, name, segments, uuid):
        """Create and activate ``name`` with the given table segments.

        Every device gets a device-mapper UUID so that tools and leak
        checks can tell this driver's devices from anyone else's.
        """
        self._run('create', dmsetup.validate_name(name),
                  '--uuid', dmsetup.validate_name(uuid),
                  process_input=dmsetup.format_table(segments) + '\n')

    def load(self, name, segments):
        """Load an inactive table into ``name``; takes effect on resume."""
        self._run('load', dmsetup.validate_name(name),
                  process_input=dmsetup.format_table(segments) + '\n')

    def suspend(self, name, flush=True):
        """Suspend ``name``; with ``flush`` in-flight I/O completes first."""
        args = ['suspend', dmsetup.validate_name(name)]
        if not flush:
            args.append('--noflush')
        self._run(*args)

    def resume(self, name):
        self._run('resume', dmsetup.validate_name(name))

    def reload(self, name, segments):
        """Swap the table of a live device: load, then resume.

        ``resume`` with an inactive table loaded suspends the device
        (flushing in-flight I/O), swaps the tables and resumes, all in
        the kernel within one ioctl (dm-ioctl's do_resume).  A separate
        ``suspend`` command would keep I/O paused while the next
        ``dmsetup`` process starts: the benchmarks (tests/bench) measured
        a pause about four times longer that way.  The new table is
        loaded first, so a table the kernel rejects never pauses I/O; a
        failed resume clears the inactive table and resumes the old one.
        """
        self.load(name, segments)
        try:
            self.resume(name)
        except exception.DMSetupCommandFailed:
            self._resume_old_table(name)
            raise

    def _resume_old_table(self, name):
        """After a failed swap: drop the inactive table, resume the old."""
        try:
            self._run('clear', dmsetup.validate_name(name))
        except exception.DMSetupCommandFailed:
            LOG.warning('Could not clear the inactive table of %s.', name)
        try:
            self.resume(name)
        except exception.DMSetupCommandFailed:
            LOG.warning('Could not resume %s with its old table.', name)

    def swap(self, name, segments, check=None):
        """Swap the table of a live device under an explicit suspend.

        ``suspend`` (in-flight I/O completes, new I/O waits), then
        ``load``, then ``resume``: unlike :meth:`reload`, the old table's
        postsuspend has run before the new table is built, which a clone
        needs when the new table reads the same metadata (dm-clone
        commits its metadata at postsuspend, and reads it when a table is
        constructed).  ``check()``, if given, runs while the device is
        suspended; when it returns False the old table resumes unchanged
        and swap returns False.  Any failure resumes the old table.
        """
        self.suspend(name)
        try:
            if check is not None and not check():
                self.resume(name)
                return False
            self.load(name, segments)
            self.resume(name)
        except BaseException:
            self._resume_old_table(name)
            raise
        return True

    def message(self, name, *words):
        """Send a target message, e.g. ``('hydration_batch_size', 16)``."""
        words = dmsetup.validate_message(*words)
        self._run('message', dmsetup.validate_name(name), '0', *words)

    def remove(self, name, retry=True):
        """Remove ``name``; a device that is already gone is not an error.

        ``--retry`` rides out a transient open count (e.g. a udev probe).
        """
        args = ['remove']
        if retry:
            args.append('--retry')
        args.append(dmsetup.validate_name(name))
        try:
            self._run(*args)
        except exception.DMDeviceNotFound:
            LOG.debug('Device-mapper device %s already removed.', name)

    def exists(self, name):
        """True if a device-mapper device called ``name`` exists."""
        try:
            self._run('info', dmsetup.validate_name(name))
        except exception.DMDeviceNotFound:
            return False
        return True

    def status(self, name):
        """Status of one device: a list of :class:`~.dmsetup.StatusLine`."""
        out, _err = self._run('status', dmsetup.validate_name(name))
        return dmsetup.parse_status(out)

    def table(self, name):
        """Table of one device: a list of :class:`~.dmsetup.Segment`."""
        out, _err = self._run('table', dmsetup.validate_name(name))
        return dmsetup.parse_table(out)

    @staticmethod
    def _unparsed(errors, log_to):
        """Log what a listing could not parse, unless a caller takes it."""
        if log_to is None:
            for name, exc in sorted(errors.items(), key=lambda e: str(e[0])):
                LOG.warning('Ignoring device-mapper device %s this time: '
                            '%s', name, exc)
        else:
            log_to.update(errors)

    def clone_statuses(self, errors=None):
        """Status of every clone target, in ONE command.

        Returns {device name: CloneStatus or FailedCloneStatus}; a device
        with several clone segments keeps the first (this project never
        builds more than one clone segment per device).  A device whose
        line cannot be parsed is left out: it goes into ``errors``
        ({name: DMStatusParseError}) when given, else to the log.
        """
        out, _err = self._run_listing('status', '--target', 'clone')
        bad = {}
        result = {}
        for name, lines in dmsetup.parse_status_all(out, errors=bad).items():
            clones = [line.clone for line in lines if line.clone is not None]
            if clones:
                result[name] = clones[0]
        self._unparsed(bad, errors)
        return result

    def statuses(self, errors=None):
        """Status of EVERY device-mapper device, in one command.

        Returns {device name: [StatusLine]}; the operator's status tool
        uses it to see linear handles and clone targets in one sample.
        Unparsable devices as in :meth:`clone_statuses`.
        """
        out, _err = self._run_listing('status')
        bad = {}
        result = dmsetup.parse_status_all(out, errors=bad)
        self._unparsed(bad, errors)
        return result

    def tables(self, target=None, errors=None):
        """Tables of every device (or those with a ``target`` segment).

        Returns {device name: [Segment]} from one command; unparsable
        devices as in :meth:`clone_statuses`.
        """
        args = ['table']
        if target is not None:
            args += ['--target', dmsetup.validate_target_type(target)]
        out, _err = self._run_listing(*args)
        bad = {}
        result = dmsetup.parse_table_all(out, errors=bad)
        self._unparsed(bad, errors)
        return result

    def uuids(self):
        """{name: dm UUID} of every device-mapper device (one command)."""
        out, _err = self._run_listing('info', '-c', '--noheadings', '-o',
                                      'name,uuid', '--separator', '|')
        return dmsetup.parse_info_uuids(out)

    def open_count(self, name):
        """How many openers hold device ``name`` (``dmsetup info``)."""
        out, _err = self._run('info', dmsetup.validate_name(name))
        return dmsetup.parse_open_count(out)

    def targets(self):
        """Loaded target types: {name: version}."""
        out, _err = self._run('targets')
        return dmsetup.parse_targets(out)

    def device_sectors(self, device):
        """Size of a block device in 512-byte sectors (``blockdev``)."""
        out, _err = self._exec('blockdev', '--getsz',
                               dmsetup.validate_device(device))
        return dmsetup.parse_sectors(out)

    def version(self):
        """``dmsetup version`` output; raises if dmsetup cannot run."""
        out, _err = self._run('version')
        return out


# --------------------------------------------------------------------------
# LIO's own openers (read from configfs, no command)
# --------------------------------------------------------------------------

#: Where LIO's block backstores are: <here>/iblock_<n>/<name>/udev_path.
LIO_CORE = '/sys/kernel/config/target/core'


def lio_openers(device, core=LIO_CORE):
    """How many of LIO's block backstores hold ``device`` open.

    An enabled iblock backstore keeps its device open (its kernel side
    opened it when enabled), so the device's open count includes it.
    Reads configfs, which any user may; compares devices by their device
    number, so that ``/dev/mapper/x`` and ``/dev/dm-3`` are the same.
    """
    try:
        wanted = _device_key(device)
    except OSError:
        return 0
    count = 0
    for so in glob.glob(os.path.join(core, 'iblock_*', '*')):
        try:
            with open(os.path.join(so, 'enable')) as f:
                enabled = f.read().strip() == '1'
            with open(os.path.join(so, 'udev_path')) as f:
                path = f.read().strip()
            if enabled and path and _device_key(path) == wanted:
                count += 1
        except OSError:
            continue
    return count


#: Where LIO's iSCSI targets are: <here>/<target>/tpgt_<n>/acls/<initiator>.
LIO_ISCSI = '/sys/kernel/config/target/iscsi'


def lio_acls(target_iqn, root=LIO_ISCSI):
    """The initiators LIO's iSCSI target ``target_iqn`` admits, lowercase.

    Cinder's LIO helper admits each connector by a node ACL named after
    its initiator, in every portal group of the volume's target; iSCSI
    names compare case-insensitively.  Reads configfs, which any user
    may.  An empty set: no such target (or no LIO).
    """
    if not target_iqn or '/' in target_iqn or target_iqn in ('.', '..'):
        raise ValueError('not an iSCSI target name: %r' % (target_iqn,))
    pattern = os.path.join(root, glob.escape(target_iqn), 'tpgt_*', 'acls',
                           '*')
    return frozenset(os.path.basename(acl).lower()
                     for acl in glob.glob(pattern))


def lio_target_exists(target_iqn, root=LIO_ISCSI):
    """True if LIO's kernel configuration holds iSCSI target ``target_iqn``.

    Reads configfs, which any user may.  False also without LIO: the
    saved configuration (``/etc/target``) is not read.
    """
    if not target_iqn or '/' in target_iqn or target_iqn in ('.', '..'):
        raise ValueError('not an iSCSI target name: %r' % (target_iqn,))
    return os.path.isdir(os.path.join(root, target_iqn))


def _device_key(path):
    """What a path opens: a block device's number, else the file itself."""
    st = os.stat(path)
    if stat.S_ISBLK(st.st_mode):
        return ('block', st.st_rdev)
    return ('file', st.st_dev, st.st_ino)


# --------------------------------------------------------------------------
# Direct I/O of the operator command (it runs as root itself)
# --------------------------------------------------------------------------

#: bytes read to probe a region: a multiple of every logical block size
#: (512 and 4096), and no bigger than the smallest region (4 KiB).
PROBE_BYTES = 4096
#: ioctl BLKZEROOUT: zero a byte range of a block device (the kernel
#: uses the device's write-zeroes command, or writes zero pages).
BLKZEROOUT = 0x127f


def probe_regions(path, region_bytes, count, probe_bytes=PROBE_BYTES):
    """The regions of a device whose first block cannot be read (EIO).

    One ``O_DIRECT`` read of ``probe_bytes`` at the start of each of the
    ``count`` regions of ``region_bytes``, past the page cache so that
    nothing cached answers.  Over a clone whose source is an
    ``error`` device, the regions that fail are exactly those never
    copied (dm-clone sends a read of an unhydrated region to the source,
    and a read never hydrates).  Any other error is raised.
    """
    failed = []
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, probe_bytes)
    try:
        for region in range(count):
            try:
                with memoryview(buf) as view:
                    os.preadv(fd, [view], region * region_bytes)
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                failed.append(region)
    finally:
        buf.close()
        os.close(fd)
    return failed


def zero_ranges(path, ranges):
    """Zero the byte ranges ``[(offset, length)]`` of a block device.

    ``BLKZEROOUT`` per range, then an ``fsync`` so that the zeroes are
    on the device (not in a volatile cache) when this returns.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, length in ranges:
            if offset % 512 or length % 512 or length <= 0:
                raise ValueError('unaligned range %d+%d' % (offset, length))
            fcntl.ioctl(fd, BLKZEROOUT, struct.pack('=QQ', offset, length))
        os.fsync(fd)
    finally:
        os.close(fd)


#: open-iscsi's sessions: <here>/session<n>/{targetname,state}
ISCSI_SESSIONS = '/sys/class/iscsi_session'


def iscsi_session_states(target_iqn, root=ISCSI_SESSIONS):
    """{session: state} of this node's iSCSI sessions to ``target_iqn``.

    Read from sysfs: ``LOGGED_IN`` while the target answers, ``FAILED``
    while the initiator tries to reach it again.  Empty: no session.
    """
    states = {}
    for session in sorted(glob.glob(os.path.join(root, 'session*'))):
        try:
            with open(os.path.join(session, 'targetname')) as f:
                name = f.read().strip()
            if name != target_iqn:
                continue
            with open(os.path.join(session, 'state')) as f:
                states[os.path.basename(session)] = f.read().strip()
        except OSError:
            continue
    return states


# --------------------------------------------------------------------------
# dd: a fresh clone's metadata
# --------------------------------------------------------------------------

#: The LVs whose head this module zeroes: ``/dev/<vg>/<lv>-dmcmeta``, the
#: metadata LV of a clone (:func:`cinder_dmclone.layout.metadata_lv_name`),
#: and nothing under ``/dev/mapper``, ``/dev/.`` or ``/dev/..``.  The
#: ``dd_metadata_head`` filter of dmclone.filters admits the same paths.
METADATA_LV_PATH_RE = re.compile(
    r'/dev/(?!\.\.?/|mapper/)[A-Za-z0-9+_.][A-Za-z0-9+_.-]*'
    r'/[A-Za-z0-9+_.][A-Za-z0-9+_.-]*-dmcmeta')
#: dd's exit status for any failure.
DD_FAILED = 1


def zero_metadata_head(path, execute=None, root_helper=None):
    """Zero the first MiB of a clone's metadata LV, so dm-clone formats it.

    dm-clone formats a metadata device whose superblock is all zeroes and
    refuses one it cannot read as its own.  ``oflag=direct``: the zeroes
    are on the device when dd returns, not in the page cache, which
    dm-clone (reading the device directly) would not see.
    ``conv=nocreat``: a path without a device node (an LV not active)
    fails with :class:`~cinder_dmclone.exception.DeviceNotFound` instead
    of creating a regular file under ``/dev``.
    """
    if not isinstance(path, str) or not METADATA_LV_PATH_RE.fullmatch(path):
        raise exception.InvalidDMName(
            value=path, reason='not the /dev/<vg>/<lv>-dmcmeta path of a '
                               'clone metadata LV')
    _run('dd', 'if=/dev/zero', 'of=%s' % path, 'bs=1M', 'count=1',
         'oflag=direct', 'conv=nocreat', execute=execute,
         root_helper=root_helper,
         known=[Known(DD_FAILED, _exactly(
             "dd: failed to open '%s': No such file or directory" % path),
             exception.DeviceNotFound)])


# --------------------------------------------------------------------------
# modprobe: the clone target
# --------------------------------------------------------------------------

#: Kernel modules the driver loads (``dmsetup targets`` lists only the
#: targets of loaded modules).
MODULES = ('dm_clone',)
#: kmod's modprobe exit status for any failure.
MODPROBE_FAILED = 1


def load_module(name, execute=None, root_helper=None):
    """Load a kernel module of :data:`MODULES` (``modprobe <name>``).

    A module already loaded or built into the kernel is success.  Not in
    the running kernel's module directory:
    :class:`~cinder_dmclone.exception.KernelModuleNotFound`; found, but
    the kernel would not load it:
    :class:`~cinder_dmclone.exception.KernelModuleRefused` (the kernel's
    log says why); rootwrap refused the command:
    :class:`~cinder_dmclone.exception.CommandRefused`.
    """
    if name not in MODULES:
        raise exception.InvalidDMName(
            value=name, reason='not a kernel module of the driver')
    _run('modprobe', name, execute=execute, root_helper=root_helper,
         known=[
             # kmod: "Module %s not found in directory %s" (FATAL)
             Known(MODPROBE_FAILED, re.compile(
                 r'modprobe: FATAL: Module %s not found in directory \S+'
                 % re.escape(name)), exception.KernelModuleNotFound),
             # kmod: "could not insert '%s': %s" with the kernel's error
             Known(MODPROBE_FAILED, re.compile(
                 r"modprobe: ERROR: could not insert '%s': .+"
                 % re.escape(name)), exception.KernelModuleRefused)])


# --------------------------------------------------------------------------
# lvs: thin pools
# --------------------------------------------------------------------------

def thin_lvs(vg, execute=None, root_helper=None):
    """{LV name: :class:`cinder_dmclone.thin.LV`} of volume group ``vg``.

    One ``lvs`` of every LV of the group with :data:`thin.LVS_COLUMNS
    <cinder_dmclone.thin.LVS_COLUMNS>`, sizes in bytes: a thin pool's
    size, data and metadata usage and chunk size, each thin LV's virtual
    size, allocated share and pool.  Read for a move into the node and
    for the pool stats, as root (LVM reads the pool's status from the
    kernel).  A line that cannot be parsed raises
    :class:`~cinder_dmclone.exception.LVSParseError`.
    """
    out, _err = _run('lvs', '--noheadings', '--nosuffix', '--units', 'b',
                     '--separator', thin.SEPARATOR, '-o',
                     ','.join(thin.LVS_COLUMNS),
                     layout.validate_vg_name(vg), execute=execute,
                     root_helper=root_helper)
    return thin.parse_lvs(out)


def vg_lv_names(vg, execute=None, root_helper=None):
    """The names of every LV of volume group ``vg``, as LVM lists them now.

    The very command of :func:`thin_lvs` (one rootwrap filter), read for
    its names: unlike brick's ``get_volumes``/``get_volume``, which take
    any failure whose message holds "not found" for "no such LV" (also
    'Volume group "X" not found' while a PV is not scanned yet), any
    failure here raises (PrivilegedCommandFailed), so an empty answer
    is LVM's positive listing of a group without them.
    """
    return frozenset(thin_lvs(vg, execute=execute, root_helper=root_helper))


# --------------------------------------------------------------------------
# What a thin LV maps: lvs, the pool's metadata snapshot, thin_dump
# --------------------------------------------------------------------------

def thin_device(vg, lv, execute=None, root_helper=None):
    """(thin id, pool) of the thin LV ``vg/lv`` (``lvs -o thin_id,pool_lv``).

    An LV that is not thin raises
    :class:`~cinder_dmclone.exception.LVSParseError`.
    """
    out, _err = _run('lvs', '--noheadings', '--separator', thin.SEPARATOR,
                     '-o', ','.join(thin.THIN_DEVICE_COLUMNS),
                     '%s/%s' % (layout.validate_vg_name(vg),
                                layout.validate_lv_name(lv)),
                     execute=execute, root_helper=root_helper)
    return thin.parse_thin_device(out)


def _pool_message_failure(name, errno_text, error):
    """dmsetup's report of the kernel refusing a message to ``name``."""
    return Known(DMSETUP_FAILED, re.compile(
        r'device-mapper: message ioctl on %s\s.*failed: %s'
        % (re.escape(name), errno_text)), error)


def _pool_message(vg, pool, word, known, execute, root_helper):
    name = dmsetup.validate_name(thin.pool_device(
        layout.validate_vg_name(vg), layout.validate_lv_name(pool)))
    _run('dmsetup', 'message', name, '0', word, execute=execute,
         root_helper=root_helper, known=known + list(DM_NOT_FOUND),
         failed=exception.DMSetupCommandFailed,
         refused=exception.DMSetupCommandRefused)


def reserve_metadata_snap(vg, pool, execute=None, root_helper=None):
    """Take the metadata snapshot of thin pool ``vg/pool``.

    The kernel commits the pool's metadata first, so the snapshot holds
    every mapping made before the message.  A pool holds one at a time:
    one already held raises
    :class:`~cinder_dmclone.exception.MetadataSnapBusy` (EBUSY).  It
    outlives a reboot: :func:`release_metadata_snap` must follow.
    """
    busy = _pool_message_failure(thin.pool_device(vg, pool),
                                 'Device or resource busy',
                                 exception.MetadataSnapBusy)
    _pool_message(vg, pool, 'reserve_metadata_snap', [busy], execute,
                  root_helper)


def release_metadata_snap(vg, pool, execute=None, root_helper=None):
    """Release the metadata snapshot of ``vg/pool``; False if none was held.

    The kernel answers EINVAL when none is held ("No pool metadata
    snapshot found"), so running it again is safe.
    """
    none_held = _pool_message_failure(thin.pool_device(vg, pool),
                                      'Invalid argument',
                                      exception.MetadataSnapNotHeld)
    try:
        _pool_message(vg, pool, 'release_metadata_snap', [none_held],
                      execute, root_helper)
    except exception.MetadataSnapNotHeld:
        return False
    return True


def pool_zeroes(vg, pool, execute=None, root_helper=None):
    """True if thin pool ``vg/pool`` zeroes the blocks it maps anew.

    ``dmsetup table`` of its ``-tpool`` device, read by
    :func:`thin.pool_zeroes <cinder_dmclone.thin.pool_zeroes>`: the
    kernel's own flag, not LVM's record of it.  A pool that is not
    active (no thin LV) raises
    :class:`~cinder_dmclone.exception.DMDeviceNotFound`.
    """
    name = thin.pool_device(layout.validate_vg_name(vg),
                            layout.validate_lv_name(pool))
    return thin.pool_zeroes(DMSetup(execute, root_helper).table(name), name)


def pool_zeroing_recorded(vg, pool, execute=None, root_helper=None):
    """True if LVM records that pool ``vg/pool`` zeroes new blocks.

    ``lvs --binary -o zero``: what LVM will load into the pool's
    thin-pool table at its next activation.  For a pool that is not
    active (no thin LV yet), whose table :func:`pool_zeroes` cannot
    read; an active pool's own table is the truth, never this.
    """
    out, _err = _run('lvs', '--noheadings', '--binary', '-o', 'zero',
                     '%s/%s' % (layout.validate_vg_name(vg),
                                layout.validate_lv_name(pool)),
                     execute=execute, root_helper=root_helper)
    flag = out.strip()
    if flag not in ('0', '1'):
        raise exception.LVSParseError(
            line=out, reason='not the zeroing flag of thin pool %s/%s'
            % (vg, pool))
    return flag == '1'


def thin_table(vg, lv, execute=None, root_helper=None):
    """The table of thin LV ``vg/lv``'s own device (``<vg>-<lv>``).

    As :func:`dmsetup.parse_table <cinder_dmclone.dmsetup.parse_table>`
    segments, for :func:`thin.check_thin_table
    <cinder_dmclone.thin.check_thin_table>`.  An LV that is not active
    raises :class:`~cinder_dmclone.exception.DMDeviceNotFound`.
    """
    return DMSetup(execute, root_helper).table(thin.lv_device(
        layout.validate_vg_name(vg), layout.validate_lv_name(lv)))


def thin_mapped_sectors(vg, lv, execute=None, root_helper=None):
    """The sectors thin LV ``vg/lv`` maps (``dmsetup status`` of it).

    Read by :func:`thin.thin_mapped_sectors
    <cinder_dmclone.thin.thin_mapped_sectors>`; the kernel's count,
    cheap whatever the LV holds.  An LV that is not active raises
    :class:`~cinder_dmclone.exception.DMDeviceNotFound`.
    """
    name = thin.lv_device(layout.validate_vg_name(vg),
                          layout.validate_lv_name(lv))
    return thin.thin_mapped_sectors(DMSetup(execute, root_helper).status(
        name), name)


def pool_block_sectors(vg, pool, execute=None, root_helper=None):
    """The data block (chunk) size of thin pool ``vg/pool``, in sectors.

    From its ``-tpool`` table, as :func:`pool_zeroes` reads it.
    """
    name = thin.pool_device(layout.validate_vg_name(vg),
                            layout.validate_lv_name(pool))
    return thin.pool_block_sectors(DMSetup(execute, root_helper).table(name),
                                   name)


#: What :func:`thin_dump` reads of a dump unless told: the bound of a
#: million mappings.
THIN_DUMP_MAX_BYTES = thin.dump_bytes_bound(1000000)


def thin_dump(vg, pool, dev_id, execute=None, root_helper=None,
              stream=None, max_bytes=THIN_DUMP_MAX_BYTES,
              max_mappings=None):
    """:class:`~cinder_dmclone.thin.DeviceMap` of thin device ``dev_id``.

    ``thin_dump`` of the pool's metadata snapshot (taken by
    :func:`reserve_metadata_snap`), of that one device.
    ``--metadata-snap`` comes before another option, never before the
    device path: its block number is optional, and the 1.x tools would
    take a path after it for one.

    Its output is parsed as it comes (``stream``, see
    :func:`_run_streamed`), never more than ``max_bytes`` of it nor
    more than ``max_mappings`` mappings: beyond either the command is
    stopped and :class:`~cinder_dmclone.exception.ThinDumpTooLarge`
    raised.  A tenant decides how fragmented its thin LV is, and the
    dump of a badly fragmented one is half a GB.
    """
    if isinstance(dev_id, bool) or not isinstance(dev_id, int) or \
            dev_id < 0:
        raise exception.InvalidDMName(value=dev_id,
                                      reason='not a thin device id')
    path = thin.pool_metadata_path(layout.validate_vg_name(vg),
                                   layout.validate_lv_name(pool))

    def too_large():
        return exception.ThinDumpTooLarge(
            dev_id=dev_id, reason='more than %d bytes of thin_dump output'
            % max_bytes)
    pieces = _run_streamed('thin_dump', '--format', 'xml',
                           '--metadata-snap', '--dev-id', str(dev_id), path,
                           max_bytes=max_bytes, stream=stream,
                           execute=execute, root_helper=root_helper,
                           too_large=too_large)
    try:
        return thin.parse_thin_dump(pieces, dev_id,
                                    max_mappings=max_mappings)
    finally:
        pieces.close()


def discard_regions(vg, lv, ranges, zero=False, execute=None,
                    root_helper=None):
    """``blkdiscard`` the sector ranges ``[(start, sectors)]`` of a handle.

    Only the handle ``dmclone-<vg>-<lv>`` (a clone while it moves): a
    discard there marks the clone's unhydrated regions it covers whole
    as hydrated, without copying them.  With ``zero``, ``--zeroout``
    writes zeroes instead (for a destination LV that is not known to
    read zeroes).  One command per range, ``--force`` (the device holds
    a file system's signature, and blkdiscard would refuse it), offsets
    in bytes.  Nothing else may use the handle meanwhile (see the
    protocol).
    """
    path = layout.handle_path(vg, lv)
    for start, sectors in ranges:
        if (isinstance(start, bool) or isinstance(sectors, bool)
                or not isinstance(start, int)
                or not isinstance(sectors, int) or start < 0
                or sectors <= 0):
            raise exception.InvalidTable(
                reason='not a sector range: %r' % ((start, sectors),))
    for start, sectors in ranges:
        args = ['--zeroout'] if zero else []
        _run('blkdiscard', *args, '--force', '--offset',
             str(start * dmsetup.SECTOR_SIZE), '--length',
             str(sectors * dmsetup.SECTOR_SIZE), path, execute=execute,
             root_helper=root_helper)


# --------------------------------------------------------------------------
# lvs: the operator tool
# --------------------------------------------------------------------------

def list_lvs(vgs, execute=None):
    """{(vg, lv)} of the logical volumes of ``vgs`` (all VGs if empty).

    For ``cinder-dmclone``: it runs as root itself, so the command
    runs directly, not through a root helper (rootwrap's filters admit
    only the volume service's commands, not this one).
    """
    vgs = [layout.validate_vg_name(vg) for vg in vgs]
    out, _err = _run('lvs', '--noheadings', '--separator', '|', '-o',
                     'vg_name,lv_name', *vgs, execute=execute,
                     run_as_root=False)
    result = set()
    for line in out.splitlines():
        vg, sep, lv = line.strip().partition('|')
        if sep:
            result.add((vg, lv))
    return result
