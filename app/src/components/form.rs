//! A form's labelled field, and the classes every form's controls and buttons share.
//! (Tailwind reads the classes from this source, so they stay literal strings.)

use leptos::prelude::*;

use crate::error::AppError;

/// A text box, select or text area of a form.
pub const INPUT: &str = "mt-1 block w-full rounded-lg border border-slate-300 px-3 py-1.5 text-sm focus:border-indigo-500 focus:outline-none focus:ring-1 focus:ring-indigo-500";
/// The small control of a table row (its label only for screen readers).
pub const SMALL_INPUT: &str = "rounded border border-slate-300 px-2 py-0.5 text-xs";
/// A field's label, a fieldset's legend, a definition list's term.
pub const LABEL: &str = "block text-xs font-medium text-slate-600";
/// Help under a field.
pub const HINT: &str = "mt-1 text-xs text-slate-600";
/// What a time field accepts: a UTC date and 24-hour time, `2026-11-27 14:00` (a `T`
/// in place of the space too, as links and scripts write it). Not `datetime-local`,
/// which browsers show in the reader's locale, with a 12-hour clock in many.
pub const UTC_TIME_PATTERN: &str = r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}";
/// The example a time field shows while empty.
pub const UTC_TIME_PLACEHOLDER: &str = "2026-11-27 14:00";

/// A form's main button.
pub const BUTTON: &str = "rounded-lg bg-indigo-600 px-4 py-2 text-sm font-semibold text-white hover:bg-indigo-500";
/// A button in a table row or list item.
pub const SMALL_BUTTON: &str =
    "rounded-md px-2 py-1 text-xs font-medium ring-1 ring-inset ring-slate-300 hover:bg-slate-50";
/// A row's button that takes something away: revoke, remove, delete.
pub const SMALL_DANGER_BUTTON: &str =
    "rounded-md px-2 py-1 text-xs font-medium text-red-700 ring-1 ring-inset ring-red-300 hover:bg-red-50";

/// The last answer of the form a field is in, given by the form as context: a refusal
/// about one field (`AppError::Invalid`) marks the field whose argument it names.
#[derive(Clone, Copy)]
pub struct FieldErrors(pub Signal<Option<AppError>>);

impl FieldErrors {
    /// Gives the fields below the answers of `action`.
    pub fn of<A>(action: ServerAction<A>)
    where
        A: leptos::server_fn::ServerFn<Error = AppError> + Send + Sync + Clone + 'static,
        A::Output: Send + Sync + 'static,
    {
        let value = action.value();
        let error = move || value.with(|answer| answer.as_ref().and_then(|a| a.as_ref().err().cloned()));
        provide_context(FieldErrors(Signal::derive(error)));
    }
}

/// Gives the fields inside the answers of `action`, as [`FieldErrors::of`] does for a whole
/// component: for a page or card with several forms, each form's fields hear only its own.
#[component]
pub fn FieldsOf<A>(action: ServerAction<A>, children: Children) -> impl IntoView
where
    A: leptos::server_fn::ServerFn<Error = AppError> + Send + Sync + Clone + 'static,
    A::Output: Send + Sync + 'static,
{
    FieldErrors::of(action);
    children()
}

/// What a field named `name` (`request[image]`) is told by the form's last answer.
fn field_error(name: &'static str) -> Signal<Option<String>> {
    let leaf = name.rsplit('[').next().unwrap_or(name).trim_end_matches(']');
    let errors = use_context::<FieldErrors>();
    // `try_get`: a page reloaded under a `Transition` keeps its old form on screen a moment
    // after the old form's signals are disposed; its field then reads as unmarked.
    Signal::derive(move || match errors?.0.try_get().flatten()? {
        AppError::Invalid { field, message } if field == leaf => Some(message),
        _ => None,
    })
}

/// A label and its control: an `<input>`, or a `<select>` when given options (its
/// children), or a `<textarea>` when given `rows`. With `help`, the help text sits under
/// the control as `<id>-hint`, and the control names it in `aria-describedby`. A refusal
/// about this field (see [`FieldErrors`]) marks the control `aria-invalid` and sits under
/// it as `<id>-error`, named in `aria-describedby` too.
///
/// Event listeners set on the field (`on:input`) sit on its wrapper, where the control's
/// events bubble up.
#[component]
pub fn Field(
    /// The control's id, which the label points at.
    id: &'static str,
    /// The form argument the control fills.
    name: &'static str,
    #[prop(into)] label: String,
    #[prop(optional, into)] help: Option<ViewFn>,
    /// The wrapper's classes (its place in the form's grid).
    #[prop(optional)]
    class: Option<&'static str>,
    /// An input's type (`email`, `password`, `number`, ...); none is text.
    #[prop(optional)]
    input_type: Option<&'static str>,
    /// The starting value (a text area's text).
    #[prop(optional, into)]
    value: Option<String>,
    #[prop(optional)] placeholder: Option<&'static str>,
    #[prop(optional)] required: bool,
    #[prop(optional)] autocomplete: Option<&'static str>,
    #[prop(optional)] inputmode: Option<&'static str>,
    #[prop(optional)] minlength: Option<u32>,
    #[prop(optional)] maxlength: Option<u32>,
    #[prop(optional)] min: Option<u32>,
    #[prop(optional)] max: Option<u32>,
    /// Makes it a UTC time field (see [`UTC_TIME_PATTERN`]).
    #[prop(optional)]
    utc_time: bool,
    /// The id of a `<datalist>` of suggestions.
    #[prop(optional)]
    list: Option<&'static str>,
    /// Makes it a text area this many rows high.
    #[prop(optional)]
    rows: Option<u32>,
    /// For what is typed as code: image references, commands, keys.
    #[prop(optional)]
    monospace: bool,
    /// The `<option>`s: makes it a select.
    #[prop(optional)]
    children: Option<Children>,
) -> impl IntoView {
    let hint = help.is_some().then(|| format!("{id}-hint"));
    let error = field_error(name);
    let marked = move || error.try_with(Option::is_some).unwrap_or(false);
    let invalid = move || marked().then_some("true");
    let described = {
        let hint = hint.clone();
        move || {
            let ids: Vec<String> = hint.iter().cloned().chain(marked().then(|| format!("{id}-error"))).collect();
            (!ids.is_empty()).then(|| ids.join(" "))
        }
    };
    let pattern = utc_time.then_some(UTC_TIME_PATTERN);
    let placeholder = if utc_time { Some(UTC_TIME_PLACEHOLDER) } else { placeholder };
    let class_of_control = if monospace { format!("{INPUT} font-mono") } else { INPUT.to_owned() };
    let control = match (rows, children) {
        (Some(rows), _) => view! {
            <textarea id=id name=name rows=rows required=required placeholder=placeholder autocomplete=autocomplete
                spellcheck="false" aria-describedby=described.clone() aria-invalid=invalid class=class_of_control>
                {value}
            </textarea>
        }
        .into_any(),
        (None, Some(options)) => view! {
            <select id=id name=name required=required aria-describedby=described.clone() aria-invalid=invalid
                class=class_of_control>
                {options()}
            </select>
        }
        .into_any(),
        (None, None) => view! {
            <input id=id name=name type=input_type value=value required=required placeholder=placeholder
                autocomplete=autocomplete inputmode=inputmode minlength=minlength maxlength=maxlength min=min max=max pattern=pattern
                list=list aria-describedby=described aria-invalid=invalid class=class_of_control/>
        }
        .into_any(),
    };
    view! {
        <div class=class>
            <label for=id class=LABEL>{label}</label>
            {control}
            {help.map(|help| view! { <p id=hint class=HINT>{help.run()}</p> })}
            {move || error.try_get().flatten().map(|message| view! {
                <p id=format!("{id}-error") class="mt-1 text-xs font-medium text-red-700">{crate::components::capitalize(&message)}</p>
            })}
        </div>
    }
}

/// The submit button of an action that takes something away (stop, cancel, revoke, remove,
/// delete), asked twice: `label` opens a panel that says what will happen and holds the
/// real submit button, `confirm`. A `<details>` element, so it asks without JavaScript too.
/// Goes inside the action's form.
#[component]
pub fn ConfirmButton(
    /// What the first button says ("Revoke").
    #[prop(into)]
    label: String,
    /// What happens, in a sentence.
    #[prop(into)]
    consequence: String,
    /// What the submit button says ("Yes, revoke").
    #[prop(into)]
    confirm: String,
    /// The first button's classes.
    #[prop(optional)]
    class: Option<&'static str>,
    /// The first button's name for screen readers where `label` alone is ambiguous
    /// ("Remove ada@laptop" in a list of keys).
    #[prop(optional, into)]
    aria_label: Option<String>,
) -> impl IntoView {
    let class = format!(
        "{} cursor-pointer list-none select-none [&::-webkit-details-marker]:hidden",
        class.unwrap_or(SMALL_DANGER_BUTTON)
    );
    view! {
        <details data-confirm="" class="relative inline-block text-left">
            <summary class=class aria-label=aria_label>{label}</summary>
            <div class="absolute right-0 z-10 mt-1 w-64 rounded-lg border border-red-200 bg-white p-3 text-left text-xs text-slate-800 shadow-lg">
                <p>{consequence}</p>
                <button type="submit" class="mt-2 rounded-md bg-red-700 px-2 py-1 text-xs font-semibold text-white hover:bg-red-600">{confirm}</button>
            </div>
        </details>
    }
}

/// The value of the input or select that `selector` finds, as the page has it now. What a person typed
/// or picked before the page was hydrated raised no event the page heard (on a slow network
/// or machine that is a while), so a form that follows its fields reads them once hydrated.
#[cfg(feature = "hydrate")]
pub fn input_value(selector: &str) -> Option<String> {
    use wasm_bindgen::JsCast;
    let element = leptos::prelude::document().query_selector(selector).ok()??;
    match element.dyn_into::<web_sys::HtmlInputElement>() {
        Ok(input) => Some(input.value()),
        Err(element) => Some(element.dyn_into::<web_sys::HtmlSelectElement>().ok()?.value()),
    }
}

/// A button that copies `text` (a key, a token, a command) to the clipboard. It needs the
/// browser's clipboard, so it shows once the page is hydrated; without JavaScript the text
/// beside it is there to select.
#[component]
pub fn CopyButton(
    #[prop(into)] text: String,
    /// What is copied, for screen readers ("Copy the API key").
    #[prop(into)]
    label: String,
) -> impl IntoView {
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));
    let copied = RwSignal::new(false);
    let copy = move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(window) = web_sys::window() {
            // The promise is left to settle on its own: a refusal leaves the text to select.
            let _ = window.navigator().clipboard().write_text(&text);
            copied.set(true);
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = &text;
    };
    view! {
        <button type="button" class=format!("mt-1 {SMALL_BUTTON}") hidden=move || !hydrated.get() aria-label=label on:click=copy>
            {move || if copied.get() { "Copied" } else { "Copy" }}
        </button>
        <span role="status" class="sr-only">{move || copied.get().then_some("Copied to the clipboard")}</span>
    }
}

/// What a `?saved=` in a page's address says: the settings forms send their page there
/// after a change, so saving says it saved, with and without JavaScript. A fixed list:
/// nothing a link carries reaches the page as text.
pub fn saved_text(what: &str) -> Option<&'static str> {
    Some(match what {
        "notifications" => "Your notification choices are saved.",
        "quota" => "The quota is saved.",
        "idle_policy" => "The idle policy is saved.",
        "quota-removed" => "The quota is removed.",
        "storage" => "The storage limit is saved.",
        "budget" => "The budget is saved.",
        "budget-removed" => "The budget is removed.",
        "sso" => "The single sign-on connection is saved.",
        "isolation" => "The tenant's isolation is saved; its environments follow.",
        "custom-images" => "The tenant's rule for custom images is saved.",
        "default-image" => "The default image is saved.",
        "port-guids" => "The tenant's InfiniBand ports are saved.",
        "maintenance" => "The maintenance window is scheduled.",
        "gpu-health" => "The GPU's health is saved.",
        "price" => "The price is saved.",
        "discount" => "The discount is saved.",
        "price-withdrawn" => "The change to come is withdrawn.",
        _ => return None,
    })
}

/// "Saved." after a settings form sent its page here with `?saved=<what>` (see
/// [`saved_text`]), as a polite status.
#[component]
pub fn SavedNotice() -> impl IntoView {
    let query = leptos_router::hooks::use_query_map();
    move || {
        query.read().get("saved").and_then(|what| saved_text(&what)).map(|text| {
            view! {
                <p role="status" data-saved="" class="mt-4 rounded-lg border border-emerald-200 bg-emerald-50 p-3 text-sm text-emerald-900">
                    {text}
                </p>
            }
        })
    }
}
