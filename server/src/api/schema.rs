//! Schemas the derives cannot see: the domain's names for roles, states and the rest,
//! taken from the domain's own lists so that they cannot drift.

use berth_domain::calendar::CalendarSpan;
use berth_domain::catalog::Offering;
use berth_domain::lifecycle::EnvState;
use berth_domain::node_health::NodeState;
use berth_domain::notification::{Kind, WebhookFormat};
use berth_domain::policy::{Action, Role};
use berth_domain::tenancy::Isolation;
use berth_platform::capacity::metering::UsageBy;
use utoipa::openapi::schema::{ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::{RefOr, schema::SchemaType};

fn one_of(values: impl IntoIterator<Item = &'static str>) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).enum_values(Some(values))
}

pub fn offering() -> ObjectBuilder {
    one_of(Offering::ALL.map(Offering::id))
}

/// A listing's `state`: empty is any.
pub fn state_filter() -> ObjectBuilder {
    one_of(["", "active", "finished", "any"])
}

pub fn usage_by() -> ObjectBuilder {
    let mut choices = vec![""];
    choices.extend(UsageBy::ALL.map(UsageBy::as_str));
    one_of(choices)
}

pub fn environment_state() -> ObjectBuilder {
    one_of(EnvState::ALL.map(EnvState::as_str))
}

/// Every size of the catalog, of every offering.
pub fn size() -> ObjectBuilder {
    let mut sizes: Vec<&'static str> = Offering::ALL.iter().flat_map(|o| o.sizes()).map(|s| s.id).collect();
    sizes.sort_unstable();
    sizes.dedup();
    one_of(sizes)
}

/// Some of the catalog's sizes.
pub fn sizes() -> ArrayBuilder {
    ArrayBuilder::new().items(size())
}

/// A calendar's span: empty is a week.
pub fn calendar_span() -> ObjectBuilder {
    let mut spans = vec![""];
    spans.extend(CalendarSpan::ALL.map(CalendarSpan::id));
    one_of(spans)
}

/// A launch's tier: empty is guaranteed.
pub fn tier_asked() -> ObjectBuilder {
    one_of(["", "guaranteed", "spot"])
}

pub fn tier() -> ObjectBuilder {
    one_of(["guaranteed", "spot"])
}

pub fn role() -> ObjectBuilder {
    one_of(Role::ALL.map(Role::as_str))
}

pub fn isolation() -> ObjectBuilder {
    one_of(Isolation::ALL.map(Isolation::as_str))
}

pub fn optional_isolation() -> RefOr<Schema> {
    OneOfBuilder::new().item(isolation()).item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null))).into()
}

/// What a tenant's status may be set to (`DELETE` deletes it).
pub fn optional_tenant_status() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(one_of(["active", "suspended"]))
        .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
        .into()
}

pub fn node_state() -> ObjectBuilder {
    one_of(NodeState::ALL.map(NodeState::as_str))
}

pub fn actions() -> ArrayBuilder {
    ArrayBuilder::new().items(one_of(Action::ALL.map(Action::as_str)))
}

/// Ids as numbers (or as a form's text).
pub fn ids() -> ArrayBuilder {
    let id =
        ObjectBuilder::new().schema_type(Type::Integer).format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)));
    ArrayBuilder::new().items(OneOfBuilder::new().item(id).item(ObjectBuilder::new().schema_type(Type::String)))
}

pub fn workload_state() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(one_of(["pulled", "running", "exited"]))
        .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
        .into()
}

/// A whole number, as a number or as text.
pub fn number_or_text() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Integer).format(None))
        .item(ObjectBuilder::new().schema_type(Type::String))
        .into()
}

pub fn optional_number_or_text() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Integer))
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
        .into()
}

/// A number, whole or not, as a number or as text.
pub fn decimal_or_text() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Number))
        .item(ObjectBuilder::new().schema_type(Type::String))
        .into()
}

pub fn optional_decimal_or_text() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Number))
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
        .into()
}

/// Offering ids.
pub fn offerings() -> ArrayBuilder {
    ArrayBuilder::new().items(offering())
}

/// Notification kinds (`environment.ready`, …).
pub fn notification_kinds() -> ArrayBuilder {
    ArrayBuilder::new().items(one_of(Kind::ALL.map(Kind::as_str)))
}

pub fn webhook_format() -> ObjectBuilder {
    one_of([WebhookFormat::Slack, WebhookFormat::Json].map(WebhookFormat::as_str))
}
