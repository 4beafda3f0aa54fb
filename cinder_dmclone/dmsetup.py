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

"""device-mapper's formats: names, tables and status, as pure functions.

Functions that build the table strings ``dmsetup create``/``load`` read,
and parse ``dmsetup status``, ``table``, ``info`` and ``targets`` output
into typed results; they are where the kernel's formats
(Documentation/admin-guide/device-mapper/dm-clone.rst) are encoded, and
they are unit-tested exhaustively.  Every name, path, message and target
type is validated here before it can reach a command line.

Nothing here runs a process: the commands themselves (``dmsetup``,
``blockdev``) run in :class:`cinder_dmclone.privileged.DMSetup`, which
builds them from these functions.  The module knows nothing of Cinder
volumes or of transfers: callers pass names and device paths.
"""

import dataclasses
import re
from typing import Optional, Union  # noqa: H301

from cinder_dmclone import exception

SECTOR_SIZE = 512
#: dm-clone's region size bounds, in 512-byte sectors (4 KiB .. 1 GiB).
MIN_REGION_SECTORS = 8
MAX_REGION_SECTORS = 2097152

# A device-mapper name as this project creates them: no spaces, no slashes,
# nothing a shell or dmsetup's own parser would treat specially.
_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.+-]{0,126}$')
# A device argument inside a table: an absolute /dev path or major:minor.
_DEVICE_RE = re.compile(r'^(/dev/[A-Za-z0-9_.+:/-]+|[0-9]+:[0-9]+)$')
_MESSAGE_WORD_RE = re.compile(r'^[a-z_]+$|^[0-9]+$')

CLONE_FEATURES = ('no_hydration', 'no_discard_passdown')
CLONE_CORE_ARGS = ('hydration_threshold', 'hydration_batch_size')
CLONE_MESSAGES = ('enable_hydration', 'disable_hydration',
                  'hydration_threshold', 'hydration_batch_size')


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

def validate_name(name):
    """Return ``name`` if it is safe as a device-mapper name, else raise."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise exception.InvalidDMName(
            value=name,
            reason='names are 1-127 characters of A-Z a-z 0-9 _ . + - '
                   'starting with a letter or digit')
    return name


def validate_device(device):
    """Return ``device`` if it is a safe table device argument, else raise.

    Tables name their devices as absolute ``/dev`` paths or ``major:minor``;
    anything else (relative paths, ``..`` components, white space) would
    either be rejected by the kernel or let a caller point a table somewhere
    it should not.
    """
    if (not isinstance(device, str) or not _DEVICE_RE.fullmatch(device)
            or '/../' in device or device.endswith('/..')):
        raise exception.InvalidDMName(
            value=device,
            reason='devices are absolute /dev paths or major:minor')
    return device


def validate_region_size(region_sectors):
    """Return the region size if dm-clone accepts it, else raise.

    The kernel wants a power of two between 8 and 2097152 sectors.
    """
    if (isinstance(region_sectors, bool)
            or not isinstance(region_sectors, int)
            or region_sectors < MIN_REGION_SECTORS
            or region_sectors > MAX_REGION_SECTORS
            or region_sectors & (region_sectors - 1)):
        raise exception.InvalidTable(
            reason='region size %r sectors is not a power of two between '
                   '%d and %d' % (region_sectors, MIN_REGION_SECTORS,
                                  MAX_REGION_SECTORS))
    return region_sectors


def _positive_int(value, what, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int):
        raise exception.InvalidTable(reason='%s must be an integer, got %r'
                                     % (what, value))
    if value < 0 or (value == 0 and not allow_zero):
        raise exception.InvalidTable(reason='%s must be %s, got %d' % (
            what, 'non-negative' if allow_zero else 'positive', value))
    return value


def validate_message(*words):
    """The words of a dm-clone message as strings, if it is one, else raise.

    Only dm-clone's own messages, e.g. ``('hydration_batch_size', 16)``:
    a known first word, then lower-case words or digits.
    """
    words = [str(w) for w in words]
    if not words or words[0] not in CLONE_MESSAGES or not all(
            _MESSAGE_WORD_RE.fullmatch(w) for w in words):
        raise exception.InvalidDMName(
            value=' '.join(words), reason='not a known dm-clone message')
    return words


def validate_target_type(target):
    """Return ``target`` if it can be a target type name, else raise."""
    if not isinstance(target, str) or not _MESSAGE_WORD_RE.fullmatch(target):
        raise exception.InvalidDMName(
            value=target, reason='not a target type name')
    return target


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Segment:
    """One line of a device-mapper table."""

    start: int
    length: int
    target: str
    args: tuple = ()

    def __str__(self):
        return ' '.join([str(self.start), str(self.length), self.target]
                        + [str(a) for a in self.args])

    @property
    def end(self):
        return self.start + self.length


def linear_segment(start, length, device, offset=0):
    """A ``linear`` segment mapping ``length`` sectors of ``device``."""
    _positive_int(start, 'start', allow_zero=True)
    _positive_int(length, 'length')
    _positive_int(offset, 'offset', allow_zero=True)
    return Segment(start, length, 'linear',
                   (validate_device(device), offset))


def clone_segment(start, length, metadata_dev, dest_dev, source_dev,
                  region_size, hydration=False, discard_passdown=True,
                  hydration_threshold=None, hydration_batch_size=None):
    """A ``clone`` segment; see dm-clone.rst for the argument order.

    ``hydration=False`` emits the ``no_hydration`` feature, so a new clone
    serves I/O at once but copies nothing in the background until
    ``enable_hydration`` is sent.  Threshold and batch size are emitted as
    core arguments only when given (both are integers, in regions).
    """
    _positive_int(start, 'start', allow_zero=True)
    _positive_int(length, 'length')
    validate_region_size(region_size)
    features = []
    if not hydration:
        features.append('no_hydration')
    if not discard_passdown:
        features.append('no_discard_passdown')
    core = []
    if hydration_threshold is not None:
        core += ['hydration_threshold',
                 _positive_int(hydration_threshold, 'hydration_threshold')]
    if hydration_batch_size is not None:
        core += ['hydration_batch_size',
                 _positive_int(hydration_batch_size, 'hydration_batch_size')]
    args = [validate_device(metadata_dev), validate_device(dest_dev),
            validate_device(source_dev), region_size]
    if features or core:
        args += [len(features)] + features
    if core:
        args += [len(core)] + core
    return Segment(start, length, 'clone', tuple(args))


def error_segment(start, length):
    """An ``error`` segment: every I/O to these sectors fails (EIO)."""
    _positive_int(start, 'start', allow_zero=True)
    _positive_int(length, 'length')
    return Segment(start, length, 'error')


def format_table(segments):
    """Join segments into a table, checking they tile the device from 0."""
    segments = list(segments)
    if not segments:
        raise exception.InvalidTable(reason='a table needs a segment')
    expected = 0
    for seg in segments:
        if seg.start != expected:
            raise exception.InvalidTable(
                reason='segment %r starts at %d, expected %d'
                       % (str(seg), seg.start, expected))
        expected = seg.end
    return '\n'.join(str(s) for s in segments)


def table_length(segments):
    """Length in sectors of the device a table describes."""
    return sum(s.length for s in segments)


def _parse_int(token, line, what):
    try:
        value = int(token)
    except (TypeError, ValueError):
        raise exception.DMStatusParseError(
            line=line, reason='%s %r is not an integer' % (what, token))
    if value < 0:
        raise exception.DMStatusParseError(
            line=line, reason='%s %r is negative' % (what, token))
    return value


def _parse_fraction(token, line, what):
    num, sep, den = token.partition('/')
    if not sep:
        raise exception.DMStatusParseError(
            line=line, reason='%s %r is not of the form a/b' % (what, token))
    num = _parse_int(num, line, what)
    den = _parse_int(den, line, what)
    if num > den:
        raise exception.DMStatusParseError(
            line=line, reason='%s %r is more than its total' % (what, token))
    return num, den


def _split_segment_line(line):
    tokens = line.split()
    if len(tokens) < 3:
        raise exception.DMStatusParseError(
            line=line, reason='expected "<start> <length> <target> ..."')
    start = _parse_int(tokens[0], line, 'start')
    length = _parse_int(tokens[1], line, 'length')
    return start, length, tokens[2], tokens[3:]


def parse_table(text):
    """Parse ``dmsetup table <name>`` output into :class:`Segment` objects.

    Arguments are kept as strings, as the kernel printed them.
    """
    segments = []
    for line in text.splitlines():
        if not line.strip():
            continue
        start, length, target, args = _split_segment_line(line)
        segments.append(Segment(start, length, target, tuple(args)))
    return segments


@dataclasses.dataclass(frozen=True)
class CloneTable:
    """The arguments of a ``clone`` table line as the kernel reports them."""

    metadata_dev: str
    dest_dev: str
    source_dev: str
    region_size: int
    features: tuple
    core_args: dict


def _parse_counted(tokens, pos, line, what):
    """Parse ``<#n> tok1 .. tokn`` starting at ``pos``; return (list, pos)."""
    if pos >= len(tokens):
        raise exception.DMStatusParseError(
            line=line, reason='missing %s count' % what)
    count = _parse_int(tokens[pos], line, '%s count' % what)
    values = tokens[pos + 1:pos + 1 + count]
    if len(values) != count:
        raise exception.DMStatusParseError(
            line=line, reason='%s count %d but %d given'
                              % (what, count, len(values)))
    return values, pos + 1 + count


def _core_args_dict(values, line):
    if len(values) % 2:
        raise exception.DMStatusParseError(
            line=line, reason='core arguments are not key/value pairs')
    result = {}
    for key, value in zip(values[::2], values[1::2]):
        result[key] = _parse_int(value, line, key)
    return result


def parse_clone_table(segment):
    """Interpret the arguments of a ``clone`` :class:`Segment`."""
    line = str(segment)
    if segment.target != 'clone':
        raise exception.DMStatusParseError(
            line=line, reason='not a clone segment')
    tokens = list(segment.args)
    if len(tokens) < 4:
        raise exception.DMStatusParseError(
            line=line, reason='clone tables have at least 4 arguments')
    region = _parse_int(tokens[3], line, 'region size')
    features, core = (), {}
    pos = 4
    if pos < len(tokens):
        values, pos = _parse_counted(tokens, pos, line, 'feature')
        features = tuple(values)
    if pos < len(tokens):
        values, pos = _parse_counted(tokens, pos, line, 'core argument')
        core = _core_args_dict(values, line)
    if pos != len(tokens):
        raise exception.DMStatusParseError(
            line=line, reason='trailing arguments %r' % tokens[pos:])
    return CloneTable(tokens[0], tokens[1], tokens[2], region, features, core)


# --------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CloneStatus:
    """A parsed dm-clone status line (see dm-clone.rst, "Status")."""

    metadata_block_size: int
    metadata_used: int
    metadata_total: int
    region_size: int
    hydrated_regions: int
    total_regions: int
    hydrating_regions: int
    features: tuple
    core_args: dict
    read_only: bool

    failed = False

    @property
    def hydration_enabled(self):
        return 'no_hydration' not in self.features

    @property
    def fully_hydrated(self):
        return self.hydrated_regions == self.total_regions

    @property
    def progress(self):
        """Fraction of regions hydrated, 0.0 .. 1.0."""
        if not self.total_regions:
            return 1.0
        return self.hydrated_regions / self.total_regions

    @property
    def hydration_threshold(self):
        return self.core_args.get('hydration_threshold')

    @property
    def hydration_batch_size(self):
        return self.core_args.get('hydration_batch_size')


@dataclasses.dataclass(frozen=True)
class FailedCloneStatus:
    """dm-clone reported ``Fail`` (metadata failure) or ``Error``."""

    state: str

    failed = True
    fully_hydrated = False


def parse_clone_status(params):
    """Parse the parameter part of a clone status line.

    Returns :class:`CloneStatus`, or :class:`FailedCloneStatus` for the
    kernel's ``Fail``/``Error`` forms; anything else raises
    :class:`~cinder_dmclone.exception.DMStatusParseError`.
    """
    line = params
    tokens = params.split()
    if tokens in (['Fail'], ['Error']):
        return FailedCloneStatus(tokens[0])
    if len(tokens) < 8:
        raise exception.DMStatusParseError(
            line=line, reason='clone status has at least 8 fields')
    md_block = _parse_int(tokens[0], line, 'metadata block size')
    md_used, md_total = _parse_fraction(tokens[1], line, 'metadata usage')
    region = _parse_int(tokens[2], line, 'region size')
    hydrated, total = _parse_fraction(tokens[3], line, 'hydrated regions')
    hydrating = _parse_int(tokens[4], line, 'hydrating regions')
    features, pos = _parse_counted(tokens, 5, line, 'feature')
    unknown = set(features) - set(CLONE_FEATURES)
    if unknown:
        raise exception.DMStatusParseError(
            line=line, reason='unknown features %s' % sorted(unknown))
    core_values, pos = _parse_counted(tokens, pos, line, 'core argument')
    core = _core_args_dict(core_values, line)
    rest = tokens[pos:]
    if rest == ['Fail']:
        return FailedCloneStatus('Fail')
    if rest not in (['rw'], ['ro']):
        raise exception.DMStatusParseError(
            line=line, reason='expected a final "rw" or "ro", got %r' % rest)
    return CloneStatus(
        metadata_block_size=md_block, metadata_used=md_used,
        metadata_total=md_total, region_size=region,
        hydrated_regions=hydrated, total_regions=total,
        hydrating_regions=hydrating, features=tuple(features),
        core_args=core, read_only=rest == ['ro'])


@dataclasses.dataclass(frozen=True)
class StatusLine:
    """One segment of ``dmsetup status`` output."""

    start: int
    length: int
    target: str
    params: str
    clone: Optional[Union[CloneStatus, FailedCloneStatus]] = None


def _parse_status_segment(line):
    start, length, target, params = _split_segment_line(line)
    params = ' '.join(params)
    clone = parse_clone_status(params) if target == 'clone' else None
    return StatusLine(start, length, target, params, clone)


def parse_status(text):
    """Parse ``dmsetup status <name>`` output: a list of StatusLine."""
    return [_parse_status_segment(line)
            for line in text.splitlines() if line.strip()]


def _split_named_line(line):
    """``(name, rest)`` of a ``<name>: <rest>`` line of a listing.

    dmsetup mangles white space in device names (``\\x20``) but not
    ``:``, so the name is the first word without its final colon.
    """
    words = line.split(None, 1)
    if len(words) != 2 or len(words[0]) < 2 or not words[0].endswith(':'):
        raise exception.DMStatusParseError(
            line=line, reason='expected "<name>: <start> <length> ..."')
    return words[0][:-1], words[1]


def _parse_listing(text, parse_rest, errors):
    """Parse ``<name>: ...`` lines into {name: [parse_rest(rest) items]}.

    With ``errors`` None, any bad line raises.  Otherwise a device with a
    bad line is left out of the result and ``errors[name]`` holds a
    DMStatusParseError that quotes the whole line; a line without a name
    is recorded under None.  The other devices are unaffected.
    """
    result, bad = {}, {}
    for line in text.splitlines():
        if not line.strip() or line.strip() == 'No devices found':
            continue
        name = None
        try:
            name, rest = _split_named_line(line)
            if name in bad:
                continue
            parsed = parse_rest(rest)
        except exception.DMStatusParseError as exc:
            if errors is None:
                raise
            result.pop(name, None)
            bad[name] = exception.DMStatusParseError(
                line=line, reason=exc.kwargs.get('reason', str(exc)))
            continue
        result.setdefault(name, []).extend(parsed)
    if errors is not None:
        errors.update(bad)
    return result


def parse_status_all(text, errors=None):
    """Parse ``dmsetup status`` for many devices: {name: [StatusLine]}.

    Each line is ``<name>: <start> <length> <target> <params>``; dmsetup says
    ``No devices found`` when there is nothing to list.  A bad line raises,
    or with an ``errors`` dict costs only its own device (see
    :func:`_parse_listing`).
    """
    return _parse_listing(
        text, lambda rest: [_parse_status_segment(rest)], errors)


def parse_table_all(text, errors=None):
    """Parse ``dmsetup table`` for many devices: {name: [Segment]}.

    The lines have the form ``<name>: <start> <length> <target> <args>``,
    as in :func:`parse_status_all`; device arguments are kept as the
    kernel printed them (``major:minor``).
    """
    return _parse_listing(text, parse_table, errors)


def parse_info_uuids(text):
    """Parse ``dmsetup info -c --noheadings -o name,uuid --separator |``.

    Returns {name: uuid}; a device without a UUID maps to ''.
    """
    result = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line == 'No devices found':
            continue
        name, sep, uuid = line.partition('|')
        if not sep:
            raise exception.DMStatusParseError(
                line=line, reason='expected "<name>|<uuid>"')
        result[name] = uuid
    return result


def parse_open_count(text):
    """The ``Open count:`` of ``dmsetup info <name>`` (run with LC_ALL=C).

    How many openers hold the device: an instance, LIO's block backstore
    exporting it, a device stacked on it.
    """
    for line in text.splitlines():
        label, sep, value = line.partition(':')
        if sep and label.strip() == 'Open count':
            return _parse_int(value.strip(), line, 'open count')
    raise exception.DMStatusParseError(
        line=text.strip()[:200], reason='no "Open count:" line')


def parse_targets(text):
    """Parse ``dmsetup targets`` output into {target: version string}."""
    targets = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            targets[parts[0]] = parts[1]
    return targets


def device_path(name):
    """The /dev/mapper path of a device-mapper name."""
    return '/dev/mapper/%s' % validate_name(name)


def parse_sectors(text):
    """Parse ``blockdev --getsz`` output: a size in 512-byte sectors."""
    return _parse_int(text.strip(), text, 'device size')


# --------------------------------------------------------------------------
# Regions a clone never copied
# --------------------------------------------------------------------------

def region_count(length, region_size):
    """Regions of a clone of ``length`` sectors (the last may be short)."""
    _positive_int(length, 'length')
    validate_region_size(region_size)
    return -(-length // region_size)


def runs(regions, count):
    """Maximal runs of consecutive region numbers: [(first, end)).

    ``regions`` are region numbers below ``count``, in any order; each
    run is ``(first, end)`` with ``end`` exclusive, sorted.
    """
    result = []
    for region in sorted(set(regions)):
        if not 0 <= region < count:
            raise exception.InvalidTable(
                reason='region %r outside 0..%d' % (region, count - 1))
        if result and result[-1][1] == region:
            result[-1] = (result[-1][0], region + 1)
        else:
            result.append((region, region + 1))
    return result


def region_sectors_range(first, end, length, region_size):
    """(start, length) in sectors of regions [first, end) of a clone.

    The last region of a clone whose length is not a multiple of the
    region size is short: the range stops at the clone's end.
    """
    start = first * region_size
    return start, min(end * region_size, length) - start


def uncopied_ranges(uncopied, length, region_size):
    """Byte ranges ``[(offset, length)]`` of the regions never copied."""
    count = region_count(length, region_size)
    return [tuple(x * SECTOR_SIZE for x in region_sectors_range(
        first, end, length, region_size))
        for first, end in runs(uncopied, count)]


def fencing_table(uncopied, length, region_size, dest_dev, total=None):
    """The table that keeps a clone's uncopied regions out of reach.

    Regions never copied map to ``error``, the others linearly to the
    destination device at the same offset; ``total`` (the destination's
    length, when it was extended past the clone) maps the tail linearly
    too.  While this table is live nothing can read or write the
    uncopied regions, so they can be zeroed underneath, and the rest of
    the volume stays usable.
    """
    count = region_count(length, region_size)
    segments = []
    position = 0
    for first, end in runs(uncopied, count):
        start, size = region_sectors_range(first, end, length, region_size)
        if start > position:
            segments.append(linear_segment(position, start - position,
                                           dest_dev, position))
        segments.append(error_segment(start, size))
        position = start + size
    total = length if total is None else total
    if total < length:
        raise exception.InvalidTable(
            reason='destination of %d sectors is shorter than the clone '
                   '(%d)' % (total, length))
    if total > position:
        segments.append(linear_segment(position, total - position,
                                       dest_dev, position))
    format_table(segments)
    return segments


_UNITS = ((1 << 40, 'T'), (1 << 30, 'G'), (1 << 20, 'M'), (1 << 10, 'K'))


def size_token(value):
    """Bytes in the largest unit that divides them exactly: '64K', '3M'."""
    for unit, suffix in _UNITS:
        if value and value % unit == 0:
            return '%d%s' % (value // unit, suffix)
    return str(value)


def ranges_text(ranges, limit=None, more='...+%d more'):
    """Byte ranges as ``offset+length`` tokens, e.g. ``0+8M,12M+64K``.

    With ``limit``, as many whole ranges as fit in ``limit`` characters
    together with the marker (``more % <ranges left out>``) that says
    some were left out.
    """
    tokens = ['%s+%s' % (size_token(offset), size_token(size))
              for offset, size in ranges]
    text = ','.join(tokens)
    if limit is None or len(text) <= limit:
        return text
    kept = []
    for i, token in enumerate(tokens):
        candidate = ','.join(kept + [token, more % (len(tokens) - i - 1)])
        if len(candidate) > limit:
            break
        kept.append(token)
    return ','.join(kept + [more % (len(tokens) - len(kept))])


def parse_size_token(token):
    """The bytes of a :func:`size_token` ('64K' -> 65536)."""
    for unit, suffix in _UNITS:
        if token.endswith(suffix):
            return int(token[:-1]) * unit
    return int(token)
