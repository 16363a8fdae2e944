// Booking ahead in real Chromium: read the availability calendar, pick a free cell for
// tomorrow, book it from the prefilled form, see it scheduled on the calendar, move its
// end, be refused a collision with a reason, and cancel it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { adminSession, artifacts, tomorrow } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  ({ berth, chrome, page, consoleErrors } = await adminSession('/calendar'));
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('the calendar shows free capacity per size and links free cells to the launch form', async () => {
  await page.getByRole('heading', { name: 'Availability' }).waitFor();
  const node = page.locator('tr[data-size="2 nodes, 16 x H100 80GB, NVLink"]');
  // The 32 H100s make two 2-node clusters at most.
  await node.getByText('2 at most').waitFor();
  await page.getByRole('link', { name: 'Day', exact: true }).click();
  await page.waitForURL(/view=day/);
  await page.goto(`${berth.url}/calendar?view=day&from=${tomorrow}`);
  const cell = page.locator('tr[data-size="8 x H100 80GB, full node"] a').nth(10);
  assert.match(await cell.getAttribute('aria-label'), /^Book: 8 x H100 80GB, full node: 4 of 4 free from 10:00$/);
  await page.screenshot({ path: join(artifacts, 'calendar.png'), fullPage: true });
  await cell.click();
  await page.waitForURL(/\/launch\/training\?size=h100-8&start=/);
  assert.equal(await page.getByLabel('Start (UTC)').inputValue(), `${tomorrow} 10:00`);
  assert.equal(await page.getByLabel('8 x H100 80GB, full node').isChecked(), true);
  // Each size says what is free for the duration from the chosen start, and follows both
  // as they are typed.
  await page.locator('[data-hint="h100-8"]').getByText(/^4 free from \w{3} \d+ \w{3} 10:00 UTC for 1 h$/).waitFor();
  // Typing is followed only once the page is hydrated (on a busy machine that comes later).
  await page.locator('body[data-hydrated]').waitFor();
  await page.getByLabel('Duration (hours)').fill('3');
  await page.locator('[data-hint="h100-8"]').getByText(/^4 free from .* 10:00 UTC for 3 h$/).waitFor();
  await page.getByLabel('Start (UTC)').fill('');
  await page.getByLabel('Start (UTC)').blur();
  await page.locator('[data-hint="h100-8"]').getByText('4 free now for 3 h').waitFor();
  await page.getByLabel('Start (UTC)').fill(`${tomorrow} 10:00`);
  await page.getByLabel('Start (UTC)').blur();
  await page.locator('[data-hint="h100-8"]').getByText(/^4 free from .* 10:00 UTC for 3 h$/).waitFor();
  // The cost of the booking follows the size and the duration, before anything is sent.
  await page.locator('[data-cost]').getByText('$76.80 for 3 h (8 x H100 80GB, full node at $25.60/h)').waitFor();
  await page.getByLabel('8 x A100 80GB, full node').check();
  await page.locator('[data-cost]').getByText('$50.40 for 3 h (8 x A100 80GB, full node at $16.80/h)').waitFor();
  await page.getByLabel('8 x H100 80GB, full node').check();
});

test('a booking for tomorrow is scheduled, waits, and shows on the calendar', async () => {
  await page.getByLabel('Name').fill('tomorrow-run');
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py');
  await page.getByLabel('Duration (hours)').fill('3');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-state="scheduled"]').waitFor();
  await page.getByText(`${tomorrow} 10:00 UTC`).first().waitFor();
  assert.equal(await page.getByLabel('Window ends (UTC)').inputValue(), `${tomorrow} 13:00`);
  const envUrl = page.url();

  await page.goto(`${berth.url}/calendar?view=day&from=${tomorrow}`);
  const mine = page.getByRole('region', { name: 'Your bookings in this range' });
  await mine.getByRole('link', { name: 'tomorrow-run' }).waitFor();
  await page.goto(envUrl);
});

test('moving the end works into free time, and an end before the start is refused with a reason', async () => {
  await page.getByLabel('Window ends (UTC)').fill(`${tomorrow}T15:00`);
  await page.getByRole('button', { name: 'Change end' }).click();
  await page.getByText(`Window ends`).first().waitFor();
  await page.waitForFunction((t) => document.body.innerText.includes(t), `${tomorrow} 15:00 UTC`);

  await page.getByLabel('Window ends (UTC)').fill(`${tomorrow}T09:00`);
  await page.getByRole('button', { name: 'Change end' }).click();
  await page.getByRole('alert').getByText('the new end must be after the start and after now').waitFor();
  await page.screenshot({ path: join(artifacts, 'booking.png'), fullPage: true });
});

test('cancelling the booking releases it without ever provisioning', async () => {
  await page.locator('summary', { hasText: 'Cancel booking' }).click();
  await page.getByRole('button', { name: 'Yes, cancel the booking' }).click();
  await page.locator('[data-state="released"]').waitFor({ timeout: 30_000 });
  assert.deepEqual(consoleErrors, []);
});

test('dragging across free cells of a row books the whole stretch', async () => {
  await page.goto(`${berth.url}/calendar?view=day&from=${tomorrow}`);
  const cells = page.locator('tr[data-size="8 x H100 80GB, full node"] a');
  await cells.nth(14).waitFor();
  // Dragging needs the page hydrated; the links work without it.
  await page.locator('table[data-drag="ready"]').waitFor();
  const box = async (i) => {
    const b = await cells.nth(i).boundingBox();
    return { x: b.x + b.width / 2, y: b.y + b.height / 2 };
  };
  const from = await box(14);
  const to = await box(17);
  await page.mouse.move(from.x, from.y);
  await page.mouse.down();
  await page.mouse.move(to.x, to.y, { steps: 8 });
  await page.locator('tr[data-size="8 x H100 80GB, full node"] a[data-selected="true"]').nth(3).waitFor();
  assert.equal(await page.locator('a[data-selected="true"]').count(), 4);
  await page.mouse.up();
  await page.waitForURL(/\/launch\/training\?size=h100-8&start=.*&hours=4$/);
  assert.equal(await page.getByLabel('Start (UTC)').inputValue(), `${tomorrow} 14:00`);
  assert.equal(await page.getByLabel('Duration (hours)').inputValue(), '4');
  assert.deepEqual(consoleErrors, []);
});

test('"as soon as possible" books the earliest free time and the page shows the start it got', async () => {
  await page.goto(`${berth.url}/launch/training?size=h100-8`);
  await page.getByLabel('Name').fill('asap-run');
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py');
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByLabel('Or: as soon as possible within (days)').fill('3');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  // Free now on the demo fleet, so it starts now: its window begins today.
  const today = new Date().toISOString().slice(0, 10);
  await page.getByText(new RegExp(`${today} \\d\\d:\\d\\d UTC`)).first().waitFor();
  // A start and a search together are refused with the reason, before anything is written.
  await page.goto(`${berth.url}/launch/training?size=h100-8&start=${tomorrow}T10:00`);
  await page.getByLabel('Name').fill('asap-both');
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py');
  await page.getByLabel('Or: as soon as possible within (days)').fill('3');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.getByRole('alert').getByText('give either a start or a number of days').waitFor();
  assert.deepEqual(consoleErrors, []);
});

test('the catalog shows sizes sold on several GPU models, and the form may allow any of them', async () => {
  await page.goto(`${berth.url}/catalog`);
  await page.locator('[data-also="h100-8"]').getByText(/Also on A100-80GB \(\$16\.80\/h\)/).waitFor();
  await page.goto(`${berth.url}/launch/training?size=h100-8`);
  await page.locator('body[data-hydrated]').waitFor();
  await page.getByLabel('Name').fill('any-model');
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py');
  await page.getByLabel('Any GPU model of this size').check();
  await page.getByLabel('GPU memory at least (GB)').fill('200');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.getByRole('alert').getByText('has 80 GB GPUs, less than the 200 GB asked for').waitFor();
  await page.getByLabel('GPU memory at least (GB)').fill('80');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  assert.deepEqual(consoleErrors, []);
});
