CREATE TABLE "corral"."input_policies" (
	"agent_uid" text NOT NULL,
	"session_id" text DEFAULT '' NOT NULL,
	"policy" text NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "input_policies_agent_uid_session_id_pk" PRIMARY KEY("agent_uid","session_id"),
	CONSTRAINT "input_policies_policy" CHECK (policy in ('queue', 'coalesce', 'interrupt', 'reject')),
	CONSTRAINT "input_policies_agent_uid" CHECK (agent_uid ~ '^[A-Za-z0-9._:@-]{1,128}$'),
	CONSTRAINT "input_policies_session_id" CHECK (session_id = '' or session_id ~ '^[A-Za-z0-9._:@-]{1,128}$')
);
