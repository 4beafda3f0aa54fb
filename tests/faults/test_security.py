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

"""The source's export during a move admits the destination only.

Two intruders on node B's network try the export node A made for the
transfer: another initiator with the right CHAP secret (the ACL refuses
it) and node B's own initiator name with a wrong secret (CHAP refuses
it).  Each uses its own open-iscsi interface record, so node B's real
session is not touched.  The intruders run on node B's kernel (its
initiator, its interface and node records, its sessions); the export
they try is node A's.
"""

import pytest

from tests.harness import driver_steps
from tests.harness import testbed

pytestmark = pytest.mark.layouts('one-kernel', 'separate')

INTRUDER_IQN = 'iqn.2024-01.org.example.intruder:node'


def iscsiadm(*args, check=True):
    return testbed.run(['iscsiadm'] + list(args), node='b', check=check,
                       timeout=120)


@pytest.fixture
def iface(cleanup):
    made = []

    def make(name, initiator):
        iscsiadm('-m', 'iface', '-I', name, '-o', 'new')
        made.append(name)
        iscsiadm('-m', 'iface', '-I', name, '-o', 'update', '-n',
                 'iface.initiatorname', '-v', initiator)
        return name

    def remove():
        for name in made:
            iscsiadm('-m', 'iface', '-I', name, '-o', 'delete', check=False)
    cleanup(remove)
    return make


def try_login(iface_name, iqn, portal, user, secret, cleanup):
    base = ['-m', 'node', '-T', iqn, '-p', portal, '-I', iface_name]
    iscsiadm(*base, '-o', 'new')
    cleanup(iscsiadm, *base, '-o', 'delete', check=False)
    cleanup(iscsiadm, *base, '--logout', check=False)
    for key, value in (('node.session.auth.authmethod', 'CHAP'),
                       ('node.session.auth.username', user),
                       ('node.session.auth.password', secret),
                       ('node.session.initial_login_retry_max', '1')):
        iscsiadm(*base, '-o', 'update', '-n', key, '-v', value)
    return iscsiadm(*base, '--login', check=False)


def test_transfer_export_refuses_other_initiators(cluster, fault, iface,
                                                  cleanup):
    fault.scenario = 'other initiators against the transfer export'
    vid, image = driver_steps.seeded_volume(cluster, 600)
    att_a, _info = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')
    md = cluster.admin_metadata(vid)
    iqn, portal = md['dmclone_target_iqn'], md['dmclone_target_portal']
    method, user, secret = cluster.volume(vid).provider_auth.split(' ', 2)
    assert method == 'CHAP'
    sessions = cluster.on_node('b', testbed.iscsi_sessions)
    assert list(sessions.values()) == [iqn]

    other = try_login(iface('intruder', INTRUDER_IQN), iqn, portal, user,
                      secret, cleanup)
    assert other.returncode != 0, other.stdout
    wrong = try_login(iface('wrongsecret', testbed.topology().b.initiator_iqn),
                      iqn, portal, user, 'not-the-secret', cleanup)
    assert wrong.returncode != 0, wrong.stdout
    # no new session
    assert cluster.on_node('b', testbed.iscsi_sessions) == sessions
    fault.detail = ('ACL refused another initiator (rc %d), CHAP refused '
                    'a wrong secret (rc %d)' % (other.returncode,
                                                wrong.returncode))
    # The real path is untouched: the clone reads node A's data.
    assert cluster.sha256(info_b['data']['device_path']) == image.digest()
    cluster.detach(vid, att_b)
    cluster.detach(vid, att_a)
    cluster.delete_volume(vid)
