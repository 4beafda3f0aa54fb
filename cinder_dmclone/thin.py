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

"""Thin pools: their usage and what a move into one needs (pure functions).

With ``lvm_type = thin`` a volume's LV is a thin LV of the pool
``<vg>-pool``: its blocks are taken from the pool's data device as they
are first written, and each is mapped in the pool's metadata device.  A
pool whose data or metadata space runs out stops every thin LV in it, so
a move into such a node must fit in both, before anything is built.

What LVM says of a pool and its thin LVs comes from one ``lvs`` report
(:func:`cinder_dmclone.privileged.thin_lvs` runs it, with the columns of
:data:`LVS_COLUMNS`, sizes in bytes), parsed by :func:`parse_lvs`;
:func:`pool_usage` sums it up for one pool, :func:`shortfall` tells
whether a move fits and :func:`free_bytes` what the pool stats report as
free.

What a thin LV maps, for a move that copies only its data (see
doc/source/contributor/thin-map.rst): :func:`parse_thin_dump` reads one
thin device out of ``thin_dump`` XML into its mapped block ranges,
:func:`needed_regions` turns them into the dm-clone regions that hold
data, :func:`discard_ranges` into the sector ranges of the others that a
destination may mark hydrated, and :func:`encode_regions` /
:func:`decode_regions` carry the regions from one node to the other.
Nothing here runs a command or knows a move's state.
"""

import base64
import dataclasses
import math
import typing
import xml.etree.ElementTree as ElementTree
import zlib

from cinder_dmclone import dmsetup
from cinder_dmclone import exception

#: The ``lvs -o`` columns of the report, in this order.
LVS_COLUMNS = ('lv_name', 'lv_size', 'data_percent', 'metadata_percent',
               'lv_metadata_size', 'chunk_size', 'pool_lv')
#: The report's field separator (no LVM name holds it).
SEPARATOR = '|'
#: Bytes of pool metadata per mapped data chunk, as the kernel's guide
#: sizes a pool's metadata device ("48 * $data_dev_size /
#: $data_block_size", device-mapper/thin-provisioning.rst); LVM's own
#: default (64 bytes per chunk) is larger, so the estimate never asks
#: for more than a pool LVM sized can hold.
METADATA_BYTES_PER_CHUNK = 48


@dataclasses.dataclass(frozen=True)
class LV:
    """One line of the report: an LV, a thin LV or a thin pool.

    Sizes in bytes.  ``data_percent`` is a thin LV's share of its
    virtual size that is mapped (or a pool's data in use), None for an
    LV that has none; ``metadata_percent``, ``metadata_size`` and
    ``chunk_size`` are a pool's (None, or 0, for the others); ``pool``
    names the pool of a thin LV ('' for any other LV).
    """

    name: str
    size: int
    data_percent: typing.Optional[float]
    metadata_percent: typing.Optional[float]
    metadata_size: typing.Optional[int]
    chunk_size: typing.Optional[int]
    pool: str

    @property
    def allocated(self):
        """Bytes of a thin LV (or pool) in use; None if LVM says none."""
        if self.data_percent is None:
            return None
        return _share(self.size, self.data_percent)


def _share(size, percent):
    """``percent`` of ``size`` bytes, rounded up (never under-counted)."""
    return math.ceil(size * percent / 100.0)


def _number(text, kind, line):
    """An ``lvs`` field: None if empty, else ``kind`` of it (or raise)."""
    text = text.strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise exception.LVSParseError(
            line=line, reason='%r is not a number' % text) from None
    if value < 0 or (kind is float and not math.isfinite(value)):
        raise exception.LVSParseError(
            line=line, reason='%r is out of range' % text)
    return value


def parse_lvs(text):
    """{LV name: :class:`LV`} of an ``lvs`` report of :data:`LVS_COLUMNS`.

    ``--noheadings --nosuffix --units b --separator '|'``: one LV per
    line, sizes in whole bytes, percentages with a decimal point (the
    command runs with ``LC_ALL=C``).  A line of any other shape raises
    :class:`~cinder_dmclone.exception.LVSParseError` naming it.
    """
    lvs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.strip().split(SEPARATOR)
        if len(fields) != len(LVS_COLUMNS):
            raise exception.LVSParseError(
                line=line, reason='%d fields, expected %d'
                % (len(fields), len(LVS_COLUMNS)))
        name, size, data, meta, meta_size, chunk, pool = fields
        size = _number(size, int, line)
        if not name.strip() or size is None:
            raise exception.LVSParseError(line=line,
                                          reason='no name or no size')
        lvs[name.strip()] = LV(
            name=name.strip(), size=size,
            data_percent=_number(data, float, line),
            metadata_percent=_number(meta, float, line),
            metadata_size=_number(meta_size, int, line),
            chunk_size=_number(chunk, int, line), pool=pool.strip())
    return lvs


@dataclasses.dataclass(frozen=True)
class Pool:
    """A thin pool's space, in bytes.

    ``provisioned`` is the sum of the virtual sizes of its thin LVs
    (volumes and snapshots alike: Cinder's provisioned capacity).
    """

    name: str
    size: int
    data_used: int
    metadata_size: int
    metadata_used: int
    chunk_size: int
    provisioned: int

    @property
    def data_free(self):
        return max(self.size - self.data_used, 0)

    @property
    def metadata_free(self):
        return max(self.metadata_size - self.metadata_used, 0)

    def mappable(self, metadata_bytes):
        """Data bytes ``metadata_bytes`` of pool metadata can map."""
        return (max(metadata_bytes, 0) // METADATA_BYTES_PER_CHUNK
                * self.chunk_size)

    def metadata_for(self, data_bytes):
        """Pool metadata, in bytes, that mapping ``data_bytes`` takes."""
        chunks = math.ceil(max(data_bytes, 0) / self.chunk_size)
        return chunks * METADATA_BYTES_PER_CHUNK


def pool_usage(lvs, name):
    """The :class:`Pool` ``name`` of ``lvs`` (as :func:`parse_lvs` gives).

    Raises LVSParseError if the report has no such pool, or names it
    without a pool's figures.
    """
    pool = lvs.get(name)
    if pool is None:
        raise exception.LVSParseError(line='', reason='no LV %s' % name)
    if None in (pool.data_percent, pool.metadata_percent,
                pool.metadata_size) or not pool.chunk_size:
        raise exception.LVSParseError(
            line=name, reason='not a thin pool (no data or metadata usage, '
                              'or no chunk size)')
    return Pool(name=name, size=pool.size, data_used=pool.allocated,
                metadata_size=pool.metadata_size,
                metadata_used=_share(pool.metadata_size,
                                     pool.metadata_percent),
                chunk_size=pool.chunk_size,
                provisioned=sum(lv.size for lv in lvs.values()
                                if lv.pool == name))


def unhydrated_bytes(statuses):
    """Bytes the clones of ``statuses`` will still write to their LVs.

    ``statuses`` are dm-clone statuses (:mod:`cinder_dmclone.dmsetup`):
    every region a clone has not hydrated yet is written once hydration
    runs, whole.  A failed clone tells nothing and counts for nothing.
    """
    return sum((s.total_regions - s.hydrated_regions) * s.region_size
               * dmsetup.SECTOR_SIZE for s in statuses if not s.failed)


def unwritten_bytes(lvs, pool, lv_names):
    """Bytes the thin LVs ``lv_names`` of ``pool`` still lack, from LVM.

    ``lvs`` as :func:`parse_lvs` gives.  Each is the data LV of a move
    into this node (a metadata LV beside it), which ends fully allocated
    once hydrated: its virtual size less what it holds already (all of
    it if LVM tells none).  Counted whether or not its clone is loaded
    (a clone not yet rebuilt after a reboot, or still being built).  An
    LV that is not in ``lvs``, or not in ``pool``, counts for nothing.
    """
    total = 0
    for name in lv_names:
        lv = lvs.get(name)
        if lv is None or lv.pool != pool:
            continue
        total += max(lv.size - (lv.allocated or 0), 0)
    return total


@dataclasses.dataclass(frozen=True)
class Shortfall:
    """What a pool lacks for a move: ``needed`` bytes, ``available``.

    ``kind`` is ``data`` (the pool's data space), ``metadata`` (its
    metadata space, to map that data) or ``provisioned`` (virtual sizes,
    bounded by ``max_over_subscription_ratio``).
    """

    kind: str
    available: int
    needed: int


def shortfall(pool, virtual, writes, pending, max_ratio,
              reserved_percentage):
    """What ``pool`` lacks for a new thin LV, or None if it fits.

    The LV has ``virtual`` bytes; ``writes`` will be written to it (all
    of it while a move hydrates every region), and ``pending`` bytes
    are still to be written by other clones in the pool.  Three
    bounds, as Cinder's capacity filter keeps them for thin pools, with
    the data that will really be written added:

    * data: ``writes + pending`` within the free data space, less
      ``reserved_percentage`` of the pool;
    * metadata: the metadata that maps them within the free metadata
      space, less the same share of it;
    * provisioned: the virtual sizes of the pool's thin LVs and this one
      within the pool, less the reserve, times ``max_ratio`` (Cinder's
      ``max_over_subscription_ratio``, resolved).
    """
    reserved = max(float(reserved_percentage), 0.0)
    data_room = pool.data_free - _share(pool.size, reserved)
    if writes + pending > data_room:
        return Shortfall('data', max(data_room, 0), writes + pending)
    meta_room = pool.metadata_free - _share(pool.metadata_size, reserved)
    meta_need = pool.metadata_for(writes + pending)
    if meta_need > meta_room:
        return Shortfall('metadata', max(meta_room, 0), meta_need)
    virtual_room = math.floor((pool.size - _share(pool.size, reserved))
                              * max_ratio)
    if pool.provisioned + virtual > virtual_room:
        return Shortfall('provisioned', virtual_room,
                         pool.provisioned + virtual)
    return None


def free_bytes(pool, pending):
    """What the pool can still take, in data bytes.

    Its free data space or what its free metadata can map, whichever is
    less, minus what clones will still write (``pending``): Cinder's
    thin ``free_capacity_gb`` counts the data space alone, as it is now.
    """
    return max(min(pool.data_free, pool.mappable(pool.metadata_free))
               - pending, 0)


def copied_bytes(needed, length, region_sectors, chunk_size, max_ranges):
    """Pool data a clone that applies the map ``needed`` makes its LV take.

    What hydration copies is every region but those
    :func:`discard_plan` discards (``needed``, the short last region and
    the gaps the plan leaves out for its bound ``max_ranges``); the
    thin LV under the clone allocates each pool chunk
    (``chunk_size`` bytes) that a copy touches, whole: a chunk partly
    copied counts whole, and a chunk two runs share counts once.
    """
    plan = discard_plan(needed, length, region_sectors, max_ranges)
    total = 0
    last = -1       # the last chunk counted
    position = 0
    for start, sectors in list(plan) + [(length, 0)]:
        if start > position:
            first = max(position * dmsetup.SECTOR_SIZE // chunk_size,
                        last + 1)
            end = (start * dmsetup.SECTOR_SIZE - 1) // chunk_size
            if end >= first:
                total += (end - first + 1) * chunk_size
                last = end
        position = start + sectors
    return total


def headroom(virtual, copied, max_ratio):
    """Room for what is written during a move that copies only its data.

    The ``virtual - copied`` bytes of a volume that its map leaves
    uncopied are an empty thin volume of that size, that the instance
    may write while the move goes on, as it may any thin volume.  They
    take their share of the pool under over-subscription: their size
    over ``max_ratio`` (Cinder's ``max_over_subscription_ratio``,
    resolved): all of it without over-subscription (1.0), a twentieth
    at Cinder's default.  (The pool's ``reserved_percentage`` is kept
    free besides.)
    """
    return math.ceil(max(virtual - copied, 0) / float(max_ratio))


def clone_writes(status, chunk_size, runs):
    """At most what one loaded clone's hydration still takes of its pool.

    ``status`` a working clone's (:mod:`cinder_dmclone.dmsetup`): every
    region not hydrated yet is copied, whole (a region a map discarded
    counts as hydrated already).  When the pool's chunks do not fall on
    region boundaries (a chunk larger than a region, or not dividing
    it), a chunk of which some regions were discarded and others are
    copied is allocated whole: one more chunk at each end of each of the
    ``runs`` runs of copied regions (one for a clone that copies
    everything; a map of :attr:`~cinder_dmclone.clone.Clones.
    MAX_DISCARD_COMMANDS` discards leaves one more than that).
    """
    left = status.total_regions - status.hydrated_regions
    region = status.region_size * dmsetup.SECTOR_SIZE
    if left <= 0:
        return 0
    slack = 0 if region % chunk_size == 0 else 2 * runs * chunk_size
    return left * region + slack


def pending_bytes(lvs, pool, lv_names, clones, runs):
    """What the moves into ``pool`` will still write to it, move by move.

    ``lv_names`` are the data LVs of the moves into this node (a
    metadata LV beside each), ``clones`` {LV name: dm-clone status} of
    those whose clone is loaded.  A working clone counts what it still
    copies (:func:`clone_writes`), never more than LVM says its LV can
    still take; a move without one (a clone not rebuilt yet after a
    reboot, still being built, or failed) counts its LV whole, as
    :func:`unwritten_bytes` does: what its map skips is known only to
    a loaded clone.  A clone of an LV that ``lvs`` does not hold yet
    counts its own figure; an LV of another pool counts for nothing.
    """
    total = 0
    for name in set(lv_names) | set(clones):
        lv = lvs.get(name)
        whole = None
        if lv is not None and lv.pool == pool.name:
            whole = max(lv.size - (lv.allocated or 0), 0)
        status = clones.get(name)
        if status is not None and not status.failed:
            writes = clone_writes(status, pool.chunk_size, runs)
            total += writes if whole is None else min(writes, whole)
        elif whole is not None:
            total += whole
    return total


# --------------------------------------------------------------------------
# A thin LV's pool and device id; the pool's device-mapper names
# --------------------------------------------------------------------------

#: The ``lvs -o`` columns of one thin LV: its device id in the pool, and
#: the pool.
THIN_DEVICE_COLUMNS = ('thin_id', 'pool_lv')


def parse_thin_device(text):
    """(thin id, pool LV name) of one line of :data:`THIN_DEVICE_COLUMNS`.

    An LV that is not thin has neither: LVSParseError, as for any other
    line that is not exactly one thin LV.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise exception.LVSParseError(line=text, reason='not one LV')
    fields = lines[0].split(SEPARATOR)
    if len(fields) != len(THIN_DEVICE_COLUMNS):
        raise exception.LVSParseError(line=lines[0], reason='not 2 fields')
    thin_id = _number(fields[0], int, lines[0])
    if thin_id is None or not fields[1].strip():
        raise exception.LVSParseError(line=lines[0], reason='not a thin LV')
    return thin_id, fields[1].strip()


def _dm_part(name):
    """An LVM name as device-mapper names hold it (dashes doubled)."""
    return name.replace('-', '--')


def lv_device(vg, lv):
    """The dm name of LV ``vg/lv``'s own device (``<vg>-<lv>``)."""
    return '%s-%s' % (_dm_part(vg), _dm_part(lv))


def pool_device(vg, pool):
    """The dm name of pool ``vg/pool``'s thin-pool target (its messages).

    LVM activates a pool that has thin LVs as ``<vg>-<pool>-tpool`` (the
    ``-tpool`` layer), the name a ``dmsetup message`` must use.
    """
    return '%s-%s-tpool' % (_dm_part(vg), _dm_part(pool))


def pool_metadata_path(vg, pool):
    """The path of pool ``vg/pool``'s metadata sub-LV (``<pool>_tmeta``).

    Hidden LVs have no ``/dev/<vg>/`` link: only the /dev/mapper node.
    """
    return '/dev/mapper/%s-%s_tmeta' % (_dm_part(vg), _dm_part(pool))


# --------------------------------------------------------------------------
# What a thin device maps: thin_dump XML
# --------------------------------------------------------------------------

#: Bytes of thin_dump output fed to the XML parser at a time.
XML_CHUNK = 1 << 20

#: Bytes of thin_dump XML one mapping takes at most: a line of
#: ``<range_mapping origin_begin= data_begin= length= time=/>`` (the
#: larger of the two elements) with its indentation, every number as
#: long as a 32-bit one (10 digits) is 111 bytes.
DUMP_BYTES_PER_MAPPING = 128

#: Bytes of thin_dump XML besides its mappings: the superblock's and
#: the device's elements, and room for the 1.x tools' ``<def>``/``<ref>``
#: lines.
DUMP_BYTES_SLACK = 1 << 20


def mappings_bound(mapped_sectors, block_sectors):
    """The most mappings a dump of a thin device can hold.

    Every ``<single_mapping>`` or ``<range_mapping>`` holds at least one
    of the device's mapped blocks (of ``block_sectors``), so a device
    mapping ``mapped_sectors`` holds at most that many blocks' worth.
    How many it really holds depends on where the pool put each block,
    which only the dump tells.
    """
    return -(-mapped_sectors // block_sectors)


def dump_bytes_bound(max_mappings):
    """The most bytes thin_dump may write for ``max_mappings`` mappings."""
    return DUMP_BYTES_SLACK + max_mappings * DUMP_BYTES_PER_MAPPING


@dataclasses.dataclass(frozen=True)
class DeviceMap:
    """The blocks thin device ``dev_id`` maps, as its pool's metadata says.

    ``ranges`` are ``(first, end)`` of the device's own (virtual) block
    numbers, ``end`` exclusive, sorted, disjoint and not adjacent;
    ``block_sectors`` is the pool's data block (chunk) size in 512-byte
    sectors.  A block not in ``ranges`` reads zeroes from the device.
    """

    dev_id: int
    block_sectors: int
    ranges: tuple

    @property
    def mapped_blocks(self):
        return sum(end - first for first, end in self.ranges)


def _merge(ranges):
    """``(first, end)`` ranges sorted, with overlapping and adjacent merged."""
    merged = []
    for first, end in sorted(ranges):
        if merged and first <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((first, end))
    return merged


class _Ranges(object):
    """Ranges as they come: appended, merged at once while in order."""

    def __init__(self):
        self.items = []
        self.ordered = True
        self.count = 0

    def add(self, first, length):
        self.count += length
        items = self.items
        if items and first == items[-1][1]:
            items[-1] = (items[-1][0], first + length)
            return
        if items and first < items[-1][1]:
            self.ordered = False
        items.append((first, first + length))

    def extend(self, other):
        for first, end in other.items:
            self.add(first, end - first)

    def merged(self):
        return tuple(self.items if self.ordered else _merge(self.items))


def _attr(element, name, dev_id, minimum=0):
    text = element.get(name)
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise exception.ThinDumpParseError(
            dev_id=dev_id, reason='<%s> has %s=%r, not a number'
            % (element.tag, name, text)) from None
    if value < minimum:
        raise exception.ThinDumpParseError(
            dev_id=dev_id, reason='<%s> has %s=%d, below %d'
            % (element.tag, name, value, minimum))
    return value


class _DumpReader(object):
    """The state of one streaming parse (see :func:`parse_thin_dump`)."""

    def __init__(self, dev_id, max_mappings=None):
        self.dev_id = dev_id
        self.max_mappings = max_mappings
        self.mappings = 0       # mapping elements read, of any device
        self.block_sectors = None
        self.defs = {}          # <def name=...>: shared mappings
        self.current = None     # the _Ranges being filled, or None
        self.current_def = None
        self.in_device = None   # dev_id of the open <device>
        self.found = None       # _Ranges of our device
        self.expected = None    # its mapped_blocks attribute

    def fail(self, reason):
        raise exception.ThinDumpParseError(dev_id=self.dev_id, reason=reason)

    def start(self, element):
        tag = element.tag
        if tag == 'superblock':
            if self.block_sectors is not None:
                self.fail('more than one <superblock>')
            self.block_sectors = _attr(element, 'data_block_size',
                                       self.dev_id, minimum=1)
        elif self.block_sectors is None:
            self.fail('<%s> outside a <superblock>' % tag)
        elif tag == 'def':
            if self.current is not None:
                self.fail('<def> inside a <def> or <device>')
            self.current_def = element.get('name')
            self.current = _Ranges()
        elif tag == 'device':
            if self.current is not None:
                self.fail('<device> inside a <def> or <device>')
            self.in_device = _attr(element, 'dev_id', self.dev_id)
            self.current = _Ranges()
            if self.in_device == self.dev_id:
                if self.found is not None:
                    self.fail('the device appears twice')
                if element.get('mapped_blocks') is not None:
                    self.expected = _attr(element, 'mapped_blocks',
                                          self.dev_id)
        elif tag in ('range_mapping', 'single_mapping', 'ref'):
            if self.current is None:
                self.fail('<%s> outside a <def> or <device>' % tag)
            if tag != 'ref':
                self.mappings += 1
                if (self.max_mappings is not None
                        and self.mappings > self.max_mappings):
                    raise exception.ThinDumpTooLarge(
                        dev_id=self.dev_id,
                        reason='more than %d mappings' % self.max_mappings)
        else:
            self.fail('unknown element <%s>' % tag)

    def end(self, element):
        tag = element.tag
        if tag == 'range_mapping':
            self.current.add(
                _attr(element, 'origin_begin', self.dev_id),
                _attr(element, 'length', self.dev_id, minimum=1))
        elif tag == 'single_mapping':
            self.current.add(_attr(element, 'origin_block', self.dev_id), 1)
        elif tag == 'ref':
            if self.in_device is None:
                self.fail('<ref> inside a <def>')
            shared = self.defs.get(element.get('name'))
            if shared is None:
                self.fail('<ref name=%r> to no <def>' % element.get('name'))
            self.current.extend(shared)
        elif tag == 'def':
            self.defs[self.current_def] = self.current
            self.current = None
        elif tag == 'device':
            if self.in_device == self.dev_id:
                self.found = self.current
            self.current = None
            self.in_device = None
        element.clear()

    def result(self):
        if self.block_sectors is None:
            self.fail('no <superblock>')
        if self.found is None:
            self.fail('the pool has no such device')
        if self.expected is not None and self.expected != self.found.count:
            self.fail('it says %d mapped blocks, its mappings hold %d'
                      % (self.expected, self.found.count))
        ranges = self.found.merged()
        if sum(e - f for f, e in ranges) != self.found.count:
            self.fail('its mappings overlap')
        return DeviceMap(dev_id=self.dev_id,
                         block_sectors=self.block_sectors, ranges=ranges)


def parse_thin_dump(text, dev_id, max_mappings=None):
    """The :class:`DeviceMap` of thin device ``dev_id`` in thin_dump XML.

    ``thin_dump --format xml`` of thin-provisioning-tools 0.9 and 1.x;
    ``text`` is the whole output (str or bytes) or an iterable of its
    pieces; it is parsed as a stream and every element is dropped once
    read, so that the ranges are all that stays in memory.  A
    ``<superblock data_block_size=...>`` holds ``<device dev_id=...>``
    elements of ``<range_mapping origin_begin= length=>`` and
    ``<single_mapping origin_block=>``; the 1.x tools also write mappings
    several devices share once, as ``<def name=...>`` before the
    devices, and ``<ref name=...>`` where a device holds them.  Other
    devices of the dump are skipped.  Anything else (not XML, cut short,
    an unknown element, a number that is not one, mappings that do not
    add up to the device's ``mapped_blocks``, no such device) raises
    :class:`~cinder_dmclone.exception.ThinDumpParseError`: a map that
    might miss a block must never be used.  More than ``max_mappings``
    mapping elements (of any device or ``<def>``) raise its subclass
    :class:`~cinder_dmclone.exception.ThinDumpTooLarge` as soon as the
    one too many is read, so the ranges kept stay bounded too.
    """
    pieces = text
    if isinstance(text, (str, bytes)):
        pieces = (text[i:i + XML_CHUNK]
                  for i in range(0, len(text), XML_CHUNK))
    reader = _DumpReader(dev_id, max_mappings)
    parser = ElementTree.XMLPullParser(events=('start', 'end'))
    try:
        for piece in pieces:
            parser.feed(piece)
            _consume(parser, reader)
        parser.close()
        _consume(parser, reader)
    except ElementTree.ParseError as exc:
        raise exception.ThinDumpParseError(
            dev_id=dev_id, reason='not well-formed XML (%s)' % exc) from None
    return reader.result()


def _consume(parser, reader):
    for event, element in parser.read_events():
        if event == 'start':
            reader.start(element)
        else:
            reader.end(element)


# --------------------------------------------------------------------------
# From mapped blocks to dm-clone regions
# --------------------------------------------------------------------------

def needed_regions(device_map, length, region_sectors):
    """Runs ``(first, end)`` of the regions of a clone that hold data.

    The clone covers the first ``length`` sectors of the thin device of
    ``device_map``, in regions of ``region_sectors``; a region is needed
    when any block the device maps overlaps it, whatever the sizes of
    blocks and regions (either may be the larger, and a block need not
    start on a region boundary).  Blocks past ``length`` are outside
    the clone and count for nothing.  Sorted, merged, ``end`` exclusive.
    """
    dmsetup.validate_region_size(region_sectors)
    count = dmsetup.region_count(length, region_sectors)
    bs = device_map.block_sectors
    runs = []
    for first, end in device_map.ranges:
        start, stop = first * bs, min(end * bs, length)
        if start >= stop:
            break
        run = (start // region_sectors, min(-(-stop // region_sectors),
                                            count))
        if runs and run[0] <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(run[1], runs[-1][1]))
        else:
            runs.append(run)
    return runs


def mapped_parts(ranges, device_map):
    """What of byte ranges ``[(offset, length)]`` the thin device maps.

    The parts in blocks ``device_map`` maps, sorted.  A block the
    device does not map reads zeroes, so zeroing what was never copied
    of a thin LV needs only these parts written; writing zeroes into an
    unmapped block would map it, taking pool space for nothing.  (Only
    where a block mapped later reads zeroes around what maps it: a pool
    that zeroes new blocks.)  ``ranges`` are disjoint.
    """
    block = device_map.block_sectors * 512
    mapped = [(first * block, end * block)
              for first, end in device_map.ranges]
    parts = []
    j = 0
    for offset, length in sorted(ranges):
        end = offset + length
        while j < len(mapped) and mapped[j][1] <= offset:
            j += 1
        k = j
        while k < len(mapped) and mapped[k][0] < end:
            low, high = max(offset, mapped[k][0]), min(end, mapped[k][1])
            parts.append((low, high - low))
            k += 1
    return parts


def discard_plan(needed, length, region_sectors, max_ranges):
    """:func:`discard_ranges` in at most ``max_ranges`` ranges.

    Each range costs one root command, so of a fragmented map only the
    ``max_ranges`` largest gaps are kept (the earlier of two as large),
    in order; the others are copied, which only costs the space and the
    reads of regions that hold zeroes.  An empty plan is valid.
    """
    if max_ranges < 1:
        raise ValueError('max_ranges must be at least 1')
    ranges = discard_ranges(needed, length, region_sectors)
    if len(ranges) <= max_ranges:
        return ranges
    largest = sorted(ranges, key=lambda r: (-r[1], r[0]))[:max_ranges]
    return sorted(largest)


def discard_ranges(needed, length, region_sectors, min_regions=1):
    """``(start, sectors)`` of the regions a destination may discard.

    Every region but the ``needed`` runs, merged.  dm-clone counts a
    discard only for the whole regions it covers, and the short last
    region of a clone whose length is not a multiple of the region size
    is never whole: it is left out (copied).  Gaps of fewer than
    ``min_regions`` regions are left out too (copying a region that
    reads zeroes is always correct; it only costs space), so that the
    number of discards stays bounded.
    """
    dmsetup.validate_region_size(region_sectors)
    whole = length // region_sectors
    result = []
    position = 0
    for first, end in list(needed) + [(whole, whole)]:
        gap_end = min(first, whole)
        if gap_end - position >= max(min_regions, 1):
            result.append((position * region_sectors,
                           (gap_end - position) * region_sectors))
        position = max(position, end)
        if position >= whole:
            break
    return result


# --------------------------------------------------------------------------
# The region map on the wire
# --------------------------------------------------------------------------

#: Version tag of :func:`encode_regions`' text.
MAP_FORMAT = 'rmap1'


def _varint(value, out):
    while True:
        byte = value & 0x7f
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def encode_regions(needed, total_regions, region_sectors):
    """The runs of :func:`needed_regions` as one short ASCII token.

    ``rmap1.<region sectors>.<total regions>.<needed>.<payload>``: the
    payload is the run lengths (gap, run, gap, run, ...) as unsigned
    LEB128 numbers, deflated and base64url-encoded without padding, so
    a volume with a few runs of data takes a few dozen characters
    whatever its size, and the worst case (every other region) about
    one byte per region before compression.  The figures before the
    payload let the receiver check the map against its own clone and
    its decoding against itself.
    """
    dmsetup.validate_region_size(region_sectors)
    out = bytearray()
    position = 0
    count = 0
    for first, end in needed:
        if (first < position or (out and first == position)
                or end <= first or end > total_regions):
            raise exception.RegionMapInvalid(
                value=needed, reason='runs must be sorted, disjoint, '
                'non-empty and within %d regions' % total_regions)
        _varint(first - position, out)
        _varint(end - first, out)
        position = end
        count += end - first
    payload = base64.urlsafe_b64encode(zlib.compress(bytes(out), 9))
    return '%s.%d.%d.%d.%s' % (MAP_FORMAT, region_sectors, total_regions,
                               count, payload.decode('ascii').rstrip('='))


def decode_regions(text, total_regions, region_sectors):
    """The runs of an :func:`encode_regions` token, checked.

    ``total_regions`` and ``region_sectors`` are the receiving clone's:
    a map made for another geometry, or one that does not decode to
    exactly its own figures, raises
    :class:`~cinder_dmclone.exception.RegionMapInvalid`.
    """
    def bad(reason):
        return exception.RegionMapInvalid(value=str(text)[:80],
                                          reason=reason)
    parts = text.split('.') if isinstance(text, str) else []
    if len(parts) != 5 or parts[0] != MAP_FORMAT:
        raise bad('not a %s map' % MAP_FORMAT)
    try:
        rs, total, count = (int(p) for p in parts[1:4])
    except ValueError:
        raise bad('its figures are not numbers') from None
    if (rs, total) != (region_sectors, total_regions):
        raise bad('made for %d regions of %d sectors, the clone has %d of '
                  '%d' % (total, rs, total_regions, region_sectors))
    try:
        packed = base64.urlsafe_b64decode(
            parts[4] + '=' * (-len(parts[4]) % 4))
        inflate = zlib.decompressobj()
        # two numbers per run, at most ten bytes each
        data = inflate.decompress(packed, 20 * total + 20)
        if (inflate.unconsumed_tail or inflate.unused_data
                or not inflate.eof):
            raise bad('its payload is too long or cut short')
    except (ValueError, zlib.error):
        raise bad('its payload does not decode') from None
    numbers = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7f) << shift
        shift += 7
        if not byte & 0x80:
            numbers.append(value)
            value = shift = 0
    if shift or len(numbers) % 2:
        raise bad('its payload ends inside a run')
    runs = []
    position = 0
    for gap, size in zip(numbers[::2], numbers[1::2]):
        if size == 0 or (runs and gap == 0):
            raise bad('empty or unmerged runs')
        runs.append((position + gap, position + gap + size))
        position += gap + size
    if position > total or sum(e - f for f, e in runs) != count:
        raise bad('its runs do not add up to %d of %d regions'
                  % (count, total))
    return runs


# --------------------------------------------------------------------------
# Whether a pool hands out zeroed blocks: its thin-pool table
# --------------------------------------------------------------------------

#: The thin-pool feature that turns zeroing of new blocks off.
SKIP_BLOCK_ZEROING = 'skip_block_zeroing'


def pool_zeroes(segments, name=''):
    """True if the thin-pool table ``segments`` zeroes newly mapped blocks.

    ``segments`` are :func:`dmsetup.parse_table <cinder_dmclone.dmsetup.
    parse_table>`'s of the pool's ``-tpool`` device: exactly one
    ``thin-pool`` segment, ``<metadata dev> <data dev> <block size> <low
    water mark> [<#features> <feature>*]``.  A block first written in
    part reads zeroes in the rest only without ``skip_block_zeroing``.
    Anything else raises :class:`~cinder_dmclone.exception.
    ThinTableInvalid`: a pool not known to zero is never trusted to.
    """
    def bad(reason):
        return exception.ThinTableInvalid(name=name, reason=reason)
    features = _pool_args(segments, name)[4:]
    if features:
        try:
            count = int(features[0])
        except ValueError:
            raise bad('feature count %r is not a number'
                      % features[0]) from None
        if count != len(features) - 1:
            raise bad('%d features announced, %d given'
                      % (count, len(features) - 1))
    return SKIP_BLOCK_ZEROING not in features[1:]


def _pool_args(segments, name):
    """The arguments of the one ``thin-pool`` segment of ``segments``."""
    if len(segments) != 1 or segments[0].target != 'thin-pool':
        raise exception.ThinTableInvalid(
            name=name, reason='not one thin-pool segment: %s'
            % '; '.join(str(s) for s in segments))
    args = [str(a) for a in segments[0].args]
    if len(args) < 4:
        raise exception.ThinTableInvalid(
            name=name, reason='%d arguments, at least 4 expected'
            % len(args))
    return args


def pool_block_sectors(segments, name=''):
    """The data block (chunk) size in sectors of a thin-pool table.

    Its third argument (see :func:`pool_zeroes`); anything but a
    positive number raises :class:`~cinder_dmclone.exception.
    ThinTableInvalid`.
    """
    text = _pool_args(segments, name)[2]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise exception.ThinTableInvalid(
            name=name, reason='block size %r is not a number of sectors'
            % text)
    return value


def thin_mapped_sectors(lines, name=''):
    """The sectors a thin device maps, from its ``dmsetup status``.

    ``lines`` are :func:`dmsetup.parse_status <cinder_dmclone.dmsetup.
    parse_status>`'s of the thin LV's own device: exactly one ``thin``
    segment, ``<nr mapped sectors> <highest mapped sector>`` (``-`` when
    nothing is mapped).  A failed device (``Fail``) or anything else
    raises :class:`~cinder_dmclone.exception.ThinTableInvalid`: no
    bound, no map.
    """
    def bad(reason):
        return exception.ThinTableInvalid(name=name, reason=reason)
    if len(lines) != 1 or lines[0].target != 'thin':
        raise bad('status is not one thin segment: %s'
                  % '; '.join(str(s) for s in lines))
    params = lines[0].params.split()
    if len(params) != 2:
        raise bad('status %r is not "<mapped sectors> <highest sector>"'
                  % lines[0].params)
    try:
        mapped = int(params[0])
    except ValueError:
        mapped = -1
    if mapped < 0:
        raise bad('mapped sectors %r is not a number' % params[0])
    return mapped


def check_thin_table(segments, dev_id, name=''):
    """Check that ``segments`` map thin device ``dev_id`` with nothing below.

    The table of a thin LV's own device (``<vg>-<lv>``): exactly one
    ``thin`` segment, ``<pool dev> <dev id>``.  A third argument is an
    *external origin*: the device reads that origin, not zeroes, where
    the pool maps nothing, so its pool's map does not say where its
    data is.  That, another device id than ``lvs`` named (the LV was
    replaced in between), or any other table raises
    :class:`~cinder_dmclone.exception.ThinTableInvalid`.
    """
    def bad(reason):
        return exception.ThinTableInvalid(name=name, reason=reason)
    if len(segments) != 1 or segments[0].target != 'thin':
        raise bad('not one thin segment: %s'
                  % '; '.join(str(s) for s in segments))
    args = [str(a) for a in segments[0].args]
    if len(args) == 3:
        raise bad('an external origin (%s) backs what the pool does not '
                  'map' % args[2])
    if len(args) != 2:
        raise bad('%d arguments, 2 expected' % len(args))
    if args[1] != str(dev_id):
        raise bad('it maps thin device %s, not %s' % (args[1], dev_id))
