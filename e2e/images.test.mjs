// The image catalog in real Chromium, as a platform admin keeps it: the seeded notebook
// images (not pinned, and said so), an entry refused for lacking its digest, a pinned
// training image added as the default, a tenant's rule for custom images, and the launch
// form offering the catalog, with the booking running the image chosen.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';

const DIGEST = 'sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08';
const NGC = `nvcr.io/nvidia/pytorch:24.05-py3@${DIGEST}`;

let berth, chrome, page, consoleErrors;

before(async () => {
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  chrome = await browser();
  page = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  consoleErrors = watchConsole(page);
  await signInAsAdmin(page, berth, '/admin/images');
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('the catalog lists the seeded images and each tenant\'s rule', async () => {
  await page.getByRole('heading', { name: "The platform's catalog" }).waitFor();
  const pytorch = page.locator('[data-image="PyTorch notebook"]');
  assert.match(await pytorch.innerText(), /quay\.io\/jupyter\/pytorch-notebook:cuda12-latest\s*not pinned/);
  assert.match(await pytorch.locator('[data-default-for]').innerText(), /Jupyter notebook/);
  // The demo's Globex runs its own images only from the registries it trusts.
  const globex = page.locator('[data-tenant-images="globex"] [data-custom-images]');
  assert.match(await globex.innerText(), /images from nvcr\.io, ghcr\.io/);
});

test('an entry without its digest is refused and nothing is added', async () => {
  await page.getByLabel('Name').fill('NGC PyTorch');
  await page.getByLabel('Image, pinned by digest').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Training jobs').first().check();
  await page.getByRole('button', { name: 'Add image' }).click();
  await page.getByText('is not pinned: add its digest').waitFor();
  assert.equal(await page.locator('[data-image="NGC PyTorch"]').count(), 0);
});

test('a pinned training image becomes the default, and a tenant is held to the catalog', async () => {
  await page.getByLabel('Image, pinned by digest').fill(NGC);
  await page.getByLabel('CUDA version').fill('12.4');
  await page.locator('#i-default-training').check();
  await page.getByRole('button', { name: 'Add image' }).click();
  const row = page.locator('[data-image="NGC PyTorch"]');
  await row.waitFor();
  assert.match(await row.innerText(), /nvcr\.io\/nvidia\/pytorch:24\.05-py3@sha256:9f86/);
  assert.doesNotMatch(await row.innerText(), /not pinned/);
  assert.match(await row.locator('[data-default-for]').innerText(), /Training job/);

  await page.getByLabel('Tenant', { exact: true }).selectOption({ label: 'acme' });
  await page.getByLabel('May run').selectOption('catalog');
  await page.getByRole('button', { name: 'Set the rule' }).click();
  await page.locator('[data-tenant-images="acme"] [data-custom-images]', { hasText: 'only catalog images' }).waitFor();
  // Saving says it saved.
  await page.locator('[data-saved]', { hasText: "The tenant's rule for custom images is saved." }).waitFor();
  await page.screenshot({ path: join(artifacts, 'images.png'), fullPage: true });
});

test('the launch form offers the catalog and the booking runs the default', async () => {
  await page.goto(`${berth.url}/launch/notebook?size=h100-1g.10gb`);
  const notebookImages = await page.getByLabel('Image', { exact: true }).locator('option').allInnerTexts();
  assert.deepEqual(notebookImages.slice(0, 1), ['PyTorch notebook (CUDA 12)']);
  assert.equal(notebookImages.length, 3, 'the training image does not suit notebooks');

  await page.goto(`${berth.url}/launch/training?size=h100-1`);
  await page.waitForFunction((ngc) => document.querySelector('#image')?.value === ngc, NGC);
  assert.equal(await page.locator('#catalog-images option').first().getAttribute('value'), NGC);
  assert.match(await page.locator('#image-hint').innerText(), /your team may run images from any registry/);
  await page.getByLabel('Name').fill('catalog-job');
  await page.getByLabel('Command').fill('python train.py; sleep infinity');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.getByText(NGC).first().waitFor();
  assert.deepEqual(consoleErrors, [], 'no errors in the browser console');
});
