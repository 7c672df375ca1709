//! Who a verified token names: a person (the issuer's subject), their roles and their teams,
//! read from the claims the configuration names. Pure.

use serde_json::Value;

/// What a person may do in the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Their own keys within what their team admin allows, their own usage.
    Member,
    /// Their team's members, keys, budgets within the team's own, usage and request log.
    TeamAdmin,
    /// Everything.
    Operator,
}

impl Role {
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "operator" => Some(Role::Operator),
            "team_admin" => Some(Role::TeamAdmin),
            "member" => Some(Role::Member),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::TeamAdmin => "team_admin",
            Role::Member => "member",
        }
    }
}

/// A person as a token names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// The issuer's subject (`sub`): who they are, for good.
    pub subject: String,
    /// What to show (`email`, else `preferred_username`, else `name`, else the subject): never
    /// used to decide anything — any user can set most of these at many providers.
    pub display: String,
    /// Their email, lowercased, only when the provider vouches for it (`email` with
    /// `email_verified: true`): what an operator's assignment "by email" is matched against.
    pub email: Option<String>,
    /// Their roles (unknown names ignored; none: a member).
    pub roles: Vec<Role>,
    /// Their teams: account names, in the claim's order (then those operators added).
    pub teams: Vec<String>,
    /// The teams they run (`team_admin`): all their claimed teams with the claimed role, and
    /// each team an operator made them team admin of.
    pub admin_of: Vec<String>,
}

impl Person {
    /// Who they are in key names, tags, logs and audit lines: what is shown and the subject
    /// (two people with the same display never read alike).
    pub fn label(&self) -> String {
        if self.display == self.subject {
            self.subject.clone()
        } else {
            format!("{} [{}]", self.display, self.subject)
        }
    }

    /// Add what an operator gave them in `account` (a team, and a role there: `team_admin` of
    /// that team only; `operator` of everything).
    pub fn assign(&mut self, account: &str, role: &str) {
        if !self.teams.iter().any(|t| t == account) {
            self.teams.push(account.to_string());
        }
        match Role::parse(role) {
            Some(Role::TeamAdmin) if !self.admin_of.iter().any(|t| t == account) => self.admin_of.push(account.to_string()),
            Some(Role::Operator) if !self.roles.contains(&Role::Operator) => {
                self.roles.push(Role::Operator);
                self.roles.sort();
            }
            _ => {}
        }
    }

    /// The highest role they hold (`team_admin` when they run a team).
    pub fn role(&self) -> Role {
        if self.roles.contains(&Role::Operator) {
            Role::Operator
        } else if !self.admin_of.is_empty() {
            Role::TeamAdmin
        } else {
            Role::Member
        }
    }
}

/// The claim at a dotted path (`realm_access.roles`); a top-level name with a dot in it is
/// found first.
pub fn claim<'a>(claims: &'a Value, path: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(claims, |v, part| v.get(part))
}

/// A claim as a list of names: an array of strings, or one string (space- or comma-separated).
fn names(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        Some(Value::String(s)) => s.split([' ', ',']).filter(|p| !p.is_empty()).map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

/// The person `claims` name, or None without a usable `sub`.
pub fn person(claims: &Value, claim_roles: &str, claim_teams: &str) -> Option<Person> {
    let subject = claims.get("sub").and_then(Value::as_str).filter(|s| !s.is_empty() && s.len() <= 255)?.to_string();
    let display = ["email", "preferred_username", "name"]
        .iter()
        .find_map(|c| claims.get(*c).and_then(Value::as_str).filter(|s| !s.is_empty()))
        .unwrap_or(&subject)
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    // `email_verified` is a boolean (some providers send the string "true").
    let verified = matches!(claims.get("email_verified"), Some(Value::Bool(true)))
        || claims.get("email_verified").and_then(Value::as_str) == Some("true");
    let email = claims
        .get("email")
        .and_then(Value::as_str)
        .filter(|e| verified && !e.is_empty() && e.len() <= 255 && !e.chars().any(char::is_control))
        .map(str::to_ascii_lowercase);
    let mut roles: Vec<Role> = names(claim(claims, claim_roles)).iter().filter_map(|r| Role::parse(r)).collect();
    roles.sort();
    roles.dedup();
    let mut teams = Vec::new();
    for t in names(claim(claims, claim_teams)) {
        if !teams.contains(&t) {
            teams.push(t);
        }
    }
    let admin_of = if roles.contains(&Role::TeamAdmin) { teams.clone() } else { Vec::new() };
    Some(Person { subject, display, email, roles, teams, admin_of })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_and_teams_come_from_the_named_claims_unknown_roles_ignored() {
        let c = json!({"sub": "u1", "email": "ada@example.com", "roles": ["team_admin", "wizard", "member"], "teams": ["research", "research", "ops"]});
        let p = person(&c, "roles", "teams").unwrap();
        assert_eq!((p.subject.as_str(), p.display.as_str()), ("u1", "ada@example.com"));
        assert_eq!(p.roles, [Role::Member, Role::TeamAdmin]);
        assert_eq!(p.role(), Role::TeamAdmin);
        assert_eq!(p.teams, ["research", "ops"]);
        // Keycloak keeps roles in an object; a string claim is split.
        let kc = json!({"sub": "u2", "realm_access": {"roles": ["operator"]}, "groups": "a b"});
        let p = person(&kc, "realm_access.roles", "groups").unwrap();
        assert_eq!((p.role(), p.teams.clone(), p.display.as_str()), (Role::Operator, vec!["a".to_string(), "b".to_string()], "u2"));
        assert_eq!(person(&json!({"sub": "u3"}), "roles", "teams").unwrap().role(), Role::Member);
        assert!(person(&json!({"email": "x"}), "roles", "teams").is_none());
    }

    #[test]
    fn an_email_counts_only_from_the_email_claim_when_the_provider_verified_it() {
        let verified = person(&json!({"sub": "s1", "email": "Ada@Example.com", "email_verified": true}), "r", "t").unwrap();
        assert_eq!(verified.email.as_deref(), Some("ada@example.com"));
        assert_eq!(verified.label(), "Ada@Example.com [s1]");
        for claims in [
            json!({"sub": "s2", "email": "ada@example.com"}),
            json!({"sub": "s2", "email": "ada@example.com", "email_verified": false}),
            json!({"sub": "s2", "name": "ADA@EXAMPLE.COM", "email_verified": true}),
            json!({"sub": "s2", "preferred_username": "ada@example.com", "email_verified": true}),
        ] {
            let p = person(&claims, "r", "t").unwrap();
            assert_eq!(p.email, None, "{claims}");
            assert!(p.label().ends_with("[s2]"), "{}", p.label());
        }
    }
}
