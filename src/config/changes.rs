//! What a reload changed, for its log line: keys and accounts added and removed, prices and
//! providers changed — and a file balance that differs from the one the file gave before, which
//! a reload never applies (a balance is set only when a key or an account is first created).

use super::Config;
use std::collections::BTreeMap;

/// What a loaded configuration holds that a reload can change, as the log names it.
#[derive(Debug, Default)]
pub struct Summary {
    /// Key (its secret, never shown) → (its name, its file balance).
    keys: BTreeMap<String, (String, f64)>,
    accounts: BTreeMap<String, f64>,
    /// Model → its price.
    prices: BTreeMap<String, super::Price>,
    /// Provider → its entry, as written.
    providers: BTreeMap<String, String>,
}

impl Summary {
    pub fn of(config: &Config) -> Summary {
        Summary {
            keys: config.keys.iter().map(|k| (k.key.clone(), (k.name.clone(), k.balance))).collect(),
            accounts: config.accounts.iter().map(|a| (a.name.clone(), a.balance)).collect(),
            prices: config.prices.clone(),
            providers: config.providers.iter().map(|p| (p.name.clone(), format!("{p:?}"))).collect(),
        }
    }

    /// What changed from `self` to `new` (`keys +1 (ci) -1 (old)`, `prices changed (alpha-5.5)`,
    /// …), and a warning for each file balance that changed but is not applied.
    pub fn changes(&self, new: &Summary) -> (Vec<String>, Vec<String>) {
        let mut what = Vec::new();
        let named = |keys: &BTreeMap<String, (String, f64)>, other: &BTreeMap<String, (String, f64)>| -> Vec<String> {
            keys.iter().filter(|(k, _)| !other.contains_key(*k)).map(|(_, (name, _))| name.clone()).collect()
        };
        let (added, removed) = (named(&new.keys, &self.keys), named(&self.keys, &new.keys));
        if !added.is_empty() || !removed.is_empty() {
            what.push(format!("keys +{} ({}) -{} ({})", added.len(), added.join(", "), removed.len(), removed.join(", ")));
        }
        let added: Vec<&str> = new.accounts.keys().filter(|n| !self.accounts.contains_key(*n)).map(String::as_str).collect();
        let removed: Vec<&str> = self.accounts.keys().filter(|n| !new.accounts.contains_key(*n)).map(String::as_str).collect();
        if !added.is_empty() || !removed.is_empty() {
            what.push(format!("accounts +{} ({}) -{} ({})", added.len(), added.join(", "), removed.len(), removed.join(", ")));
        }
        for (label, changed) in [("prices", changed(&self.prices, &new.prices)), ("providers", changed(&self.providers, &new.providers))] {
            if !changed.is_empty() {
                what.push(format!("{label} changed ({})", changed.join(", ")));
            }
        }
        let mut warnings = Vec::new();
        for (key, (name, balance)) in &new.keys {
            if let Some((_, before)) = self.keys.get(key).filter(|(_, before)| before != balance) {
                warnings.push(format!(
                    "key '{name}': its balance in the file changed ({before} → {balance} USD) and is not applied: a key's balance is set only when it is first created; move money with PATCH /admin/keys/{{id}} {{\"balance_delta\": …}}"
                ));
            }
        }
        for (account, balance) in &new.accounts {
            if let Some(before) = self.accounts.get(account).filter(|before| *before != balance) {
                warnings.push(format!(
                    "account '{account}': its balance in the file changed ({before} → {balance} USD) and is not applied: an account's balance is set only when it is first created; move money with PATCH /admin/accounts/{account} {{\"balance_delta\": …}}"
                ));
            }
        }
        (what, warnings)
    }
}

/// The names whose entry differs between `old` and `now` (added, removed or changed).
fn changed<'a, V: PartialEq>(old: &'a BTreeMap<String, V>, now: &'a BTreeMap<String, V>) -> Vec<&'a str> {
    old.keys().chain(now.keys().filter(|k| !old.contains_key(*k))).filter(|k| old.get(*k) != now.get(*k)).map(String::as_str).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        priced(1.0, extra)
    }

    fn priced(input: f64, extra: &str) -> Config {
        let text = format!(
            "listen: 127.0.0.1:8080\nproviders:\n  - {{ name: oa, protocol: openai, base_url: \"http://127.0.0.1:9\", api_key: k, models: [m] }}\nprices:\n  m: {{ input: {input}, output: 2 }}\n{extra}"
        );
        Config::parse(&text, &|_| None).expect("config")
    }

    #[test]
    fn a_reload_says_what_changed_and_that_a_changed_file_balance_is_not_applied() {
        let before = Summary::of(&config(
            "keys:\n  - { key: sk-aaaaaaaa-1, name: one, balance: 5 }\n  - { key: sk-bbbbbbbb-2, name: two, balance: 1 }\n",
        ));
        let after = Summary::of(&config(
            "keys:\n  - { key: sk-aaaaaaaa-1, name: one, balance: 9 }\n  - { key: sk-cccccccc-3, name: three, balance: 1 }\n",
        ));
        let (what, warnings) = before.changes(&after);
        assert_eq!(what, vec!["keys +1 (three) -1 (two)".to_string()]);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("key 'one': its balance in the file changed (5 → 9 USD) and is not applied"), "{warnings:?}");
        assert!(warnings[0].contains("balance_delta") && !warnings[0].contains("sk-aaaa"), "{warnings:?}");
        let (what, _) = Summary::of(&config("")).changes(&Summary::of(&priced(3.0, "")));
        assert_eq!(what, vec!["prices changed (m)".to_string()]);
        assert_eq!(Summary::of(&config("")).changes(&Summary::of(&config(""))), (vec![], vec![]));
    }
}
