//! `tidemark tenants`: the deployment's tenants and shards (spec section 20), for its
//! operators (a `*` token): list, show, create, remove, move one to another shard, and the
//! shards with their heads. Its arguments are here, beside what it does.

use clap::{Args, Subcommand};
use serde_json::json;

use super::client::Client;
use super::operator::items;
use super::{CliResult, ClientArgs};

#[derive(Debug, Args)]
pub struct TenantsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: TenantsAction,
}

#[derive(Debug, Subcommand)]
pub enum TenantsAction {
    /// Every tenant ever created (removed ones marked), with its shard.
    List,
    /// One tenant.
    Show {
        /// The tenant's name.
        name: String,
    },
    /// Create a tenant (admin); it is placed in the shard with the fewest live tenants.
    Create {
        /// The new tenant's name: 1 to 32 of a-z0-9_-, starting with a letter.
        name: String,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
    /// Remove a tenant (admin): its events stay; its API answers 404 from now on.
    Remove {
        /// The tenant's name.
        name: String,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
    /// Move a tenant to an empty shard (admin): copy, fence its changes, verify, switch. Its
    /// positions mean the same afterwards; prints the move once the tenant lives there.
    Move {
        /// The tenant's name.
        name: String,
        /// The shard to move it to: one no tenant was ever placed in.
        #[arg(long)]
        shard: u32,
        /// Why, recorded on the event.
        #[arg(long)]
        reason: String,
    },
    /// Every shard: its head, the seq its models have folded, its live tenants.
    Shards,
}

pub(crate) async fn tenants(a: TenantsArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let ops = c.ops();
    let v = match a.action {
        TenantsAction::List => {
            let v = c.op(ops.list_tenants()).await?;
            return out.list(
                &items(&v, "tenants"),
                &["name", "shard", "created_at", "by", "reason", "removed"],
            );
        }
        TenantsAction::Shards => {
            let v = c.op(ops.list_shards()).await?;
            return out.list(
                &items(&v, "shards"),
                &["shard", "head", "as_of_seq", "tenants"],
            );
        }
        TenantsAction::Show { name } => c.op(ops.get_tenant(&name)).await?,
        TenantsAction::Create { name, reason } => {
            c.op(ops.create_tenant(&json!({"name": name, "reason": reason})))
                .await?
        }
        TenantsAction::Remove { name, reason } => {
            // 204: nothing to read back; say what was done.
            c.op(ops.delete_tenant(&name, &json!({"reason": reason})))
                .await?;
            json!({"name": name, "removed": true})
        }
        TenantsAction::Move {
            name,
            shard,
            reason,
        } => {
            c.op(ops.move_tenant(&name, &json!({"shard": shard, "reason": reason})))
                .await?
        }
    };
    out.one(&v)
}
