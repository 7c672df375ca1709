//! A client that presents an access token of the identity provider instead of a gateway key
//! (`Authorization: Bearer <JWT>`): the token verified (`crate::identity`), the person it
//! names found, and their own key used as if they had presented it — its policy, its limits,
//! its balance and its team's account. A person's first call makes that key: named after them,
//! in `identity.oidc.group`, drawing on the first of their teams that is an account here (with
//! `identity.oidc.allowance`, when set, as a personal cap); the key follows their team when the provider moves
//! them. An operator disables or edits it like any key; a disabled one refuses the person.

use super::Gateway;
use crate::access::auth::{hash_key, hex};
use crate::identity::Identity;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyLookup;
use crate::records::key::{KeyOrigin, KeyRecord};
use std::sync::Arc;

fn refused(why: impl std::fmt::Display) -> ApiError {
    log::info!("identity: a client's token was refused: {why}");
    ApiError::new(ErrorKind::Unauthorized, "The access token was not accepted: it is invalid, expired, or not issued for this gateway.")
}

fn internal(e: crate::store::StoreError) -> ApiError {
    match e {
        crate::store::StoreError::Shared(e) => {
            log::warn!("identity: {e}");
            crate::store::fleet::unavailable("the person's key")
        }
        e => {
            log::error!("identity: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while reading the person's key.")
        }
    }
}

/// The team a person's key draws on: the first of the provider's teams that is an account
/// here, else the first account an operator put them in.
pub(super) async fn team_of(gw: &Gateway, person: &crate::identity::Person) -> Result<Option<String>, ApiError> {
    if let Some(t) = person.teams.iter().find(|t| gw.keys.account(t).is_some()) {
        return Ok(Some(t.clone()));
    }
    let accounts = gw.keys.all_accounts().await.map_err(internal)?;
    Ok(accounts.into_iter().find(|a| a.role_of(&person.subject, person.email.as_deref()).is_some()).map(|a| a.name))
}

fn no_team() -> ApiError {
    ApiError::new(ErrorKind::Forbidden, "The identity provider names no team of this gateway for you; ask your team admin to add you.")
}

/// The key of the person `token` names.
pub(super) async fn key_of(gw: &Gateway, identity: &Identity, token: &str) -> Result<Arc<KeyRecord>, ApiError> {
    gw.metrics.counter("tollgate_identity_tokens_total", &[]).add(1);
    let claims = identity.verify_fetching(token, &identity.cfg.audience, None).await.map_err(|e| {
        gw.metrics.counter("tollgate_identity_refused_total", &[]).add(1);
        refused(e)
    })?;
    let person = identity.person(&claims).ok_or_else(|| refused("it names no subject"))?;
    key_for(gw, identity, &person).await
}

/// The key of `person` (made at their first call; following their team when it changed).
pub(super) async fn key_for(gw: &Gateway, identity: &Identity, person: &crate::identity::Person) -> Result<Arc<KeyRecord>, ApiError> {
    let person = person.clone();
    // A team an operator put them in counts as one the provider names.
    let assigned = |name: &str| gw.keys.account(name).is_some_and(|a| a.role_of(&person.subject, person.email.as_deref()).is_some());
    let secret = identity.person_secret(&person.subject);
    match gw.keys.lookup(&secret) {
        KeyLookup::Stale => Err(crate::store::fleet::unavailable("the key list")),
        KeyLookup::Found(_) => {
            // Its state checked as any key's: revoked, disabled, expired.
            let rec = gw.keys.authenticate(Some(&secret))?;
            let still_member = rec.policy.account.as_ref().is_some_and(|a| person.teams.contains(a) || assigned(a));
            if still_member {
                return Ok(rec);
            }
            match team_of(gw, &person).await? {
                // The provider moved them to another team: their key follows.
                Some(team) => {
                    let mut moved = (*rec).clone();
                    moved.policy.account = Some(team.clone());
                    moved.policy.tags.insert("team".into(), team.clone());
                    if let Some(ceiling) = gw.keys.account(&team).and_then(|a| a.member_policy.clone()) {
                        ceiling.apply(&mut moved);
                    }
                    gw.keys.put_key(&moved).await.map_err(internal)?;
                    log::info!("identity: {} ({}) now draws on team {team}", person.label(), moved.id);
                    let why = format!("key of {} moved to team {team} (the identity provider's teams)", person.label());
                    gw.ledger.top_up_because(&moved.id, 0, Some(&why)).await.map_err(internal)?;
                    Ok(Arc::new(moved))
                }
                None => Err(no_team()),
            }
        }
        KeyLookup::Unknown => {
            let team = team_of(gw, &person).await?.ok_or_else(no_team)?;
            let routing = gw.routing.load();
            if !routing.catalog.has_group(&identity.cfg.group) {
                log::error!(
                    "identity: identity.oidc.group '{}' is not a group; {} cannot be given a key",
                    identity.cfg.group,
                    person.label()
                );
                return Err(ApiError::new(ErrorKind::Internal, "The gateway's identity settings name no usable group."));
            }
            let hash = hex(&hash_key(&secret));
            let mut policy = crate::policy::KeyPolicy { account: Some(team.clone()), ..Default::default() };
            policy.tags.insert("person".into(), person.label());
            policy.tags.insert("team".into(), team.clone());
            let rec = KeyRecord {
                policy,
                owner: Some(person.subject.clone()),
                // The operator's `identity.oidc.allowance`, when set, bounds each person's key;
                // without one it draws on the team's account alone.
                allowance_cap: identity.cfg.allowance_nanos > 0,
                ..KeyRecord::new(format!("key_idp_{}", &hash[..16]), person.label(), identity.cfg.group.clone(), hash, KeyOrigin::Identity)
            };
            let mut rec = rec;
            if let Some(ceiling) = gw.keys.account(&team).and_then(|a| a.member_policy.clone()) {
                ceiling.apply(&mut rec);
            }
            gw.ledger.open_account(&rec.id, identity.cfg.allowance_nanos).await.map_err(internal)?;
            gw.keys.put_key(&rec).await.map_err(internal)?;
            log::info!("identity: {} signed in for the first time: key {} of team {team}", person.label(), rec.id);
            let why = format!("key made for {} at their first call with the identity provider's token, on team {team}", person.label());
            gw.ledger.top_up_because(&rec.id, 0, Some(&why)).await.map_err(internal)?;
            Ok(Arc::new(rec))
        }
    }
}
