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

"""Bad configuration and damaged state: a clear error, no data touched.

(Malformed ``dmsetup status`` output cannot be made by a real kernel;
the parser's answers to it are covered by tests/unit/test_dmsetup.py.)
"""

import pytest

from tests.faults import helpers
from tests.harness import driver_steps
from tests.harness import testbed

pytestmark = pytest.mark.layouts('one-kernel', 'separate')


@pytest.mark.parametrize('option,value,message', [
    ('dmclone_region_size', 100, 'region'),
    ('dmclone_metadata_volume_group', 'no-such-vg',
     'Metadata volume group no-such-vg'),
])
def test_bad_configuration_stops_the_service(cluster, fault, option, value,
                                             message):
    fault.scenario = 'bad configuration: %s = %s' % (option, value)
    cluster.stop('b')
    with pytest.raises(Exception) as info:
        cluster.start('b', overrides={option: value})
    text = str(info.value)
    assert message in text, text
    fault.detail = 'service refused to start: %s' % text.splitlines()[0][:140]
    cluster.start('b')


def test_source_lv_smaller_than_the_volume(cluster, fault):
    fault.scenario = 'source LV smaller than its volume record'
    vid, image = driver_steps.seeded_volume(cluster, 500)
    cluster.set_size(vid, 2)                     # the record lies
    att_a, _info = cluster.attach(vid, 'a')
    with pytest.raises(Exception) as info:
        cluster.attach(vid, 'b')
    assert 'refusing to move it' in str(info.value)
    fault.detail = 'attach refused: %s' % str(info.value).splitlines()[0][:140]
    cluster.set_size(vid, 1)
    helpers.end_on_a(cluster, vid, image, att_a)


def test_nonsense_transfer_metadata(cluster, fault):
    fault.scenario = 'transfer admin metadata edited to nonsense'
    from cinder.db import api as db
    vid, image = driver_steps.seeded_volume(cluster, 510)
    att_a, info_a = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')
    good = cluster.admin_metadata(vid)['dmclone_region_sectors']
    db.volume_admin_metadata_update(cluster.ctxt(), vid, {
        'dmclone_region_sectors': 'lots'}, False)
    cluster.stop('b', kill=True)
    cluster.start('b')              # recovery skips it, logs why
    with pytest.raises(Exception) as info:
        cluster.attach(vid, 'a')
    assert 'is invalid' in str(info.value), str(info.value)
    fault.detail = str(info.value).splitlines()[0][:160]
    # Nothing was touched: the clone still serves node A's data.
    assert cluster.sha256(info_b['data']['device_path']) == image.digest()
    # The operator puts the value back; the failed migration rolls back.
    db.volume_admin_metadata_update(cluster.ctxt(), vid, {
        'dmclone_region_sectors': good}, False)
    cluster.detach(vid, att_b)
    helpers.end_on_a(cluster, vid, image, att_a)


def test_metadata_lv_missing_after_reboot(cluster, fault):
    fault.scenario = 'metadata LV missing when the destination reboots'
    vid, image = driver_steps.seeded_volume(cluster, 520)
    att_a, info_a = cluster.attach(vid, 'a')
    att_b, _info = cluster.attach(vid, 'b')         # cloned
    helpers.reboot_b(cluster)
    topo = testbed.topology().b
    testbed.lvm('lvremove', '-q', '-f',
                '%s/volume-%s-dmcmeta' % (topo.meta_vg, vid), node='b')
    cluster.start('b')      # recovery refuses a clone without its metadata
    assert not any(vid in n for n in cluster.on_node('b', testbed.dm_devices)
                   if 'dmc--b' in n)
    # The source never stopped holding the data (on node A's kernel).
    assert cluster.sha256(driver_steps.handle(vid, 'a')) == image.digest()
    # The migration is abandoned: the destination detaches (rollback).
    cluster.detach(vid, att_b)
    # Rolled back to A, but B's data LV is kept, not wiped: without its
    # metadata nothing tells whether the instance ever wrote there (after
    # a switch-over whose source attachment outlived it).  Until
    # 2026-11-26 this test expected B's copy wiped too; the driver then
    # held the move on B instead, a hold no commit could ever end.
    data_lv = '%s/volume-%s' % (topo.vg, vid)
    assert data_lv in cluster.on_node('b', testbed.list_lvs)
    assert helpers.nothing_on_b(cluster, vid) == ['LVs %s' % [data_lv]]
    fault.detail = ('recovery refused to build the clone; rolled back, '
                    "B's LV kept for the operator")
    # The operator checks that the instance never ran on B and removes it.
    testbed.lvm('lvremove', '-q', '-f', data_lv, node='b')
    helpers.end_on_a(cluster, vid, image, att_a)
