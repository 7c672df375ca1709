//! The key-policy fields, declared once: the configuration file's keys, the admin API's create
//! and patch bodies and [`super::PolicyInput`] are all made by [`with_key_policy!`], so a new
//! field is one line here (and its rule in `KeyPolicy::parse`).

/// Declares struct `$name` — its own fields first — with every key-policy field after them,
/// each `Option<T>`:
///
/// * `plain`: the fields, public (`PolicyInput`);
/// * `input`: serde defaults, and `policy_input(&mut self)` takes them out as a `PolicyInput`;
/// * `patch`: `Option<Option<T>>` (`null` clears a field, absent leaves it; the caller's
///   `double_option` reads them), and `patch_policy(&mut self, &mut PolicyInput)` applies them.
#[macro_export]
macro_rules! with_key_policy {
    ($mode:ident $(#[$meta:meta])* $vis:vis struct $name:ident { $($own:tt)* }) => {
        $crate::with_key_policy!(@emit $mode [$(#[$meta])*] $vis $name [$($own)*]
            /// RFC 3339.
            expires_at: String,
            /// Which models the key may call.
            models: $crate::policy::ModelRules,
            /// The addresses (CIDR blocks) it may be used from.
            ip_allow: Vec<String>,
            /// USD: the most one request may cost.
            max_request_cost: f64,
            max_output_tokens: u64,
            default_output_tokens: u64,
            budgets: $crate::policy::budget::BudgetsInput,
            /// Its shared account (checked against the accounts that exist by the caller).
            account: String,
            tags: std::collections::BTreeMap<String, String>,
            /// MCP tools (`server__tool`) the key may see and call.
            tools: $crate::policy::ModelRules,
            tool_rpm: u32,
            /// Guardrails (by name) every call of the key goes through, besides its group's and account's.
            guardrails: Vec<String>,
            /// Its response-cache entry (`cache: { ttl, scope, max_entry_bytes, streams }`).
            cache: $crate::policy::cache::CachePolicy,
        );
    };
    (@emit plain [$($meta:tt)*] $vis:vis $name:ident [$($own:tt)*] $($(#[doc = $doc:expr])* $f:ident: $t:ty,)*) => {
        $($meta)* $vis struct $name { $($own)* $($(#[doc = $doc])* pub $f: Option<$t>,)* }
    };
    (@emit input [$($meta:tt)*] $vis:vis $name:ident [$($own:tt)*] $($(#[doc = $doc:expr])* $f:ident: $t:ty,)*) => {
        $($meta)* $vis struct $name { $($own)* $($(#[doc = $doc])* #[serde(default)] $f: Option<$t>,)* }
        impl $name {
            /// The key-policy fields as given, taken out.
            fn policy_input(&mut self) -> $crate::policy::PolicyInput {
                $crate::policy::PolicyInput { $($f: self.$f.take(),)* }
            }
        }
    };
    (@emit patch [$($meta:tt)*] $vis:vis $name:ident [$($own:tt)*] $($(#[doc = $doc:expr])* $f:ident: $t:ty,)*) => {
        $($meta)* $vis struct $name { $($own)* $($(#[doc = $doc])* #[serde(default, deserialize_with = "double_option")] $f: Option<Option<$t>>,)* }
        impl $name {
            /// The fields the patch names, applied to `input` (`null` clears one).
            fn patch_policy(&mut self, input: &mut $crate::policy::PolicyInput) {
                $(if let Some(value) = self.$f.take() {
                    input.$f = value;
                })*
            }
        }
    };
}
