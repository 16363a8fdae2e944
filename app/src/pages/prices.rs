use berth_domain::metering::format_money;
use berth_domain::rates::{CardChange, DiscountLine, PriceLine, PriceList, effective_text, format_percent};
use leptos::prelude::*;
use leptos_meta::Title;

use crate::components::form::BUTTON;
use crate::components::table::{CELL, ROW_HEADER};
use crate::components::{CARD, ConfirmButton, ErrorAlert, Field, RequireUser, SavedNotice, Table};
use crate::serverfns::{SetDiscount, SetPrice, WithdrawPriceChange, rate_card_page};

/// The rate card (`/admin/prices`, also `/prices`): what an hour of each kind of unit costs
/// on each GPU model, now and from coming days, and the discounts. Everyone signed in reads
/// the prices (they are the catalog's); platform admins change them and see tenants'
/// discounts.
#[component]
pub fn PricesPage() -> impl IntoView {
    let set_price = ServerAction::<SetPrice>::new();
    let set_discount = ServerAction::<SetDiscount>::new();
    let withdraw = ServerAction::<WithdrawPriceChange>::new();
    let page = Resource::new(
        move || (set_price.version().get(), set_discount.version().get(), withdraw.version().get()),
        |_| rate_card_page(),
    );
    view! {
        <Title text="Prices"/>
        <RequireUser>
            <h1 class="text-2xl font-bold tracking-tight text-slate-900">"Rate card"</h1>
            <SavedNotice/>
            <p class="mt-1 max-w-3xl text-sm text-slate-600">
                "What an hour of each kind of unit costs on each GPU model: a whole GPU (a dedicated cluster's node costs its GPUs), a MIG slice, a share of a time-sliced GPU. A booking is charged, hour by hour, the price in force then, less the spot discount for spot bookings and the team's discount. A change takes effect now or at midnight (UTC) of a coming day; what has been charged is never charged again at another price."
            </p>
            {move || withdraw.value().get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
            <Transition fallback=|| view! { <p class="text-slate-600">"Loading..."</p> }>
                {move || Suspend::new(async move {
                    match page.await {
                        Ok(list) => view! {
                            <PriceTable list=list.clone() withdraw/>
                            <Discounts list=list.clone() withdraw/>
                            <PriceForm list=list.clone() set_price/>
                            <DiscountForm list set_discount/>
                        }
                        .into_any(),
                        Err(error) => view! { <ErrorAlert error/> }.into_any(),
                    }
                })}
            </Transition>
        </RequireUser>
    }
}

/// A line's (or a discount's) changes still to come, each with a withdraw button for
/// platform admins.
#[component]
fn ToCome(
    changes: Vec<CardChange>,
    discount: bool,
    may_manage: bool,
    withdraw: ServerAction<WithdrawPriceChange>,
    what: String,
) -> impl IntoView {
    let to_come: Vec<CardChange> = changes.into_iter().filter(|c| c.to_come).collect();
    if to_come.is_empty() {
        return view! { <span class="text-slate-600">"none"</span> }.into_any();
    }
    view! {
        <ul class="space-y-1">
            {to_come.into_iter().map(|c| {
                let value = if discount { format!("{} off", format_percent(c.value)) } else { format_money(c.value) };
                let text = format!("{value} from {}", effective_text(c.effective_from));
                let label = format!("Withdraw {what}: {text}");
                view! {
                    <li class="flex items-center gap-2" data-to-come="">
                        <span>{text.clone()}</span>
                        {may_manage.then(|| view! {
                            <ActionForm action=withdraw attr:class="inline">
                                <input type="hidden" name="kind" value=if discount { "discount" } else { "price" }/>
                                <input type="hidden" name="id" value=c.id.to_string()/>
                                <ConfirmButton label="Withdraw" aria_label=label
                                    consequence=format!("The change to {text} will not happen; the price in force stays.")
                                    confirm="Yes, withdraw"/>
                            </ActionForm>
                        })}
                    </li>
                }
            }).collect_view()}
        </ul>
    }
    .into_any()
}

#[component]
fn PriceTable(list: PriceList, withdraw: ServerAction<WithdrawPriceChange>) -> impl IntoView {
    let may_manage = list.may_manage;
    view! {
        <Table label="Prices" columns=&["Line", "In force now", "Changes to come", "Catalog sizes"]>
            {list.lines.into_iter().map(|line: PriceLine| {
                let now = line.cents_per_hour.map_or_else(|| "no price".to_owned(), |c| format!("{} per {}", format_money(c), line.per));
                view! {
                    <tr data-price-line=line.id.clone()>
                        <th scope="row" class=ROW_HEADER>{line.label.clone()}</th>
                        <td class=CELL data-in-force="">{now}</td>
                        <td class=CELL>
                            <ToCome changes=line.changes discount=false may_manage withdraw what=line.label.clone()/>
                        </td>
                        <td class="px-4 py-2 text-xs text-slate-700">{line.sizes.join("; ")}</td>
                    </tr>
                }
            }).collect_view()}
        </Table>
    }
}

#[component]
fn Discounts(list: PriceList, withdraw: ServerAction<WithdrawPriceChange>) -> impl IntoView {
    let may_manage = list.may_manage;
    let mut rows = vec![list.spot];
    rows.extend(list.tenants);
    view! {
        <section class=CARD aria-labelledby="discounts">
            <h2 id="discounts" class="text-sm font-semibold text-slate-900">"Discounts"</h2>
            <p class="mt-1 text-xs text-slate-600">"Off every hour charged while in force: the spot discount on spot bookings, a team's discount on all of the team's; both apply one after the other."</p>
            <Table label="Discounts" columns=&["Whose", "In force now", "Changes to come"]>
                {rows.into_iter().map(|d: DiscountLine| {
                    let whose = d.tenant.clone().map_or_else(|| "Spot bookings".to_owned(), |t| format!("Tenant {t}"));
                    view! {
                        <tr data-discount=d.tenant.clone().unwrap_or_else(|| "spot".into())>
                            <th scope="row" class=ROW_HEADER>{whose.clone()}</th>
                            <td class=CELL>{format_percent(d.basis_points)}</td>
                            <td class=CELL>
                                <ToCome changes=d.changes discount=true may_manage withdraw what=format!("the discount of {whose}")/>
                            </td>
                        </tr>
                    }
                }).collect_view()}
            </Table>
        </section>
    }
}

const EFFECTIVE_HELP: &str = "Empty: now. Or a coming day (2026-12-01): from its midnight, UTC.";

#[component]
fn PriceForm(list: PriceList, set_price: ServerAction<SetPrice>) -> impl IntoView {
    if !list.may_manage {
        return ().into_any();
    }
    let result = set_price.value();
    view! {
        <section class=CARD aria-labelledby="set-price">
            <h2 id="set-price" class="text-sm font-semibold text-slate-900">"Change a price"</h2>
            <ActionForm action=set_price attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="price-line" name="line" label="Line" class="sm:col-span-2">
                    {list.lines.iter().map(|l| view! { <option value=l.id.clone()>{l.label.clone()}</option> }).collect_view()}
                </Field>
                <Field id="price-price" name="price" label="Dollars per unit-hour" inputmode="decimal" placeholder="3.20" required=true/>
                <Field id="price-effective" name="effective" label="From" placeholder="now" class="sm:col-span-2"
                    help=|| EFFECTIVE_HELP/>
                <div class="flex items-end">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Save price"</button>
                </div>
            </ActionForm>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}

#[component]
fn DiscountForm(list: PriceList, set_discount: ServerAction<SetDiscount>) -> impl IntoView {
    if !list.may_manage {
        return ().into_any();
    }
    let result = set_discount.value();
    view! {
        <section class=CARD aria-labelledby="set-discount">
            <h2 id="set-discount" class="text-sm font-semibold text-slate-900">"Set a discount"</h2>
            <ActionForm action=set_discount attr:class="mt-3 grid gap-3 sm:grid-cols-6">
                <Field id="discount-whose" name="tenant" label="Whose" class="sm:col-span-2">
                    <option value="">"Spot bookings"</option>
                    {list.tenant_choices.iter().map(|(slug, name)| view! { <option value=slug.clone()>{format!("Tenant {name}")}</option> }).collect_view()}
                </Field>
                <Field id="discount-percent" name="percent" label="Percent off" inputmode="decimal" placeholder="15" required=true/>
                <Field id="discount-effective" name="effective" label="From" placeholder="now" class="sm:col-span-2"
                    help=|| EFFECTIVE_HELP/>
                <div class="flex items-end">
                    <button type="submit" class=format!("w-full {BUTTON}")>"Save discount"</button>
                </div>
            </ActionForm>
            {move || result.get().and_then(Result::err).map(|error| view! { <ErrorAlert error/> })}
        </section>
    }
    .into_any()
}
