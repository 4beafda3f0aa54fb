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
free.  Nothing here runs a command or knows a move's state.
"""

import dataclasses
import math
import typing

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
