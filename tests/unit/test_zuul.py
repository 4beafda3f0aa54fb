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

"""The shape of .zuul.yaml: what can be checked without a Zuul.

Zuul itself never runs here, so this checks what would make it reject the
file or run nothing useful: valid YAML, every job a pipeline names defined
here or known upstream, parents known, playbooks present, tox
environments present.
"""

import configparser
import os

import yaml

from cinder.tests.unit import test

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

#: Jobs defined by openstack-zuul-jobs, devstack and tempest that
#: .zuul.yaml uses (by name or as a parent).
UPSTREAM_JOBS = {
    'openstack-tox': None,
    'openstack-tox-pep8': 'pep8',
    'openstack-tox-py311': 'py311',
    'openstack-tox-cover': 'cover',
    'openstack-tox-docs': 'docs',
    'devstack-tempest': None,
}


def load_zuul():
    with open(os.path.join(ROOT, '.zuul.yaml')) as f:
        return yaml.safe_load(f)


def tox_envs():
    parser = configparser.RawConfigParser(interpolation=None)
    parser.read(os.path.join(ROOT, 'tox.ini'))
    envs = {s.split(':', 1)[1] for s in parser.sections()
            if s.startswith('testenv:')}
    # tox 4 makes pyXY environments from [testenv] on demand.
    return envs | {'py311'}


class ZuulConfigTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.config = load_zuul()
        self.jobs = {item['job']['name']: item['job']
                     for item in self.config if 'job' in item}
        projects = [item['project'] for item in self.config
                    if 'project' in item]
        self.assertEqual(1, len(projects))
        self.project = projects[0]

    def _pipeline_jobs(self, pipeline):
        names = []
        for entry in self.project[pipeline]['jobs']:
            names.append(entry if isinstance(entry, str)
                         else next(iter(entry)))
        return names

    def test_every_pipeline_job_is_defined(self):
        for pipeline in ('check', 'gate'):
            for name in self._pipeline_jobs(pipeline):
                self.assertTrue(name in self.jobs or name in UPSTREAM_JOBS,
                                '%s job %s is defined nowhere'
                                % (pipeline, name))

    def test_the_jobs_the_project_promises(self):
        check = self._pipeline_jobs('check')
        for name in ('openstack-tox-pep8', 'openstack-tox-py311',
                     'cinder-dmclone-functional',
                     'cinder-dmclone-devstack-multinode',
                     'cinder-dmclone-tox-devstack'):
            self.assertIn(name, check)
        # a job that cannot run here may not block the gate on day one
        self.assertNotIn('cinder-dmclone-devstack-multinode',
                         self._pipeline_jobs('gate'))

    def test_parents_playbooks_and_tox_envs_exist(self):
        envs = tox_envs()
        for name, job in self.jobs.items():
            parent = job.get('parent')
            self.assertTrue(parent in self.jobs or parent in UPSTREAM_JOBS,
                            'parent %s of %s unknown' % (parent, name))
            self.assertTrue(bool(job.get('description')), name)
            for key in ('pre-run', 'run', 'post-run'):
                for path in ([job[key]] if isinstance(job.get(key), str)
                             else job.get(key, [])):
                    self.assertTrue(os.path.exists(os.path.join(ROOT, path)),
                                    '%s of %s: %s missing'
                                    % (key, name, path))
            envlist = job.get('vars', {}).get('tox_envlist')
            if envlist and envlist != 'all':
                self.assertIn(envlist, envs, name)
        for job, env in UPSTREAM_JOBS.items():
            if env:
                self.assertIn(env, envs, job)

    def test_multinode_job_runs_the_plugin_on_every_node(self):
        job = self.jobs['cinder-dmclone-devstack-multinode']
        subnode = job['group-vars']['subnode']
        for node_vars in (job['vars'], subnode):
            self.assertIn('cinder-dmclone', node_vars['devstack_plugins'])
            self.assertTrue(node_vars['devstack_services']['c-vol'])
            self.assertEqual('stack-dmclone-meta', node_vars[
                'devstack_localrc']['CINDER_DMCLONE_METADATA_VOLUME_GROUP'])
        regex = job['vars']['tempest_test_regex']
        self.assertIn('tempest\\.api\\.volume', regex)
        self.assertIn('test_live_migration', regex)
