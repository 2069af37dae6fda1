/** The live stream's public types (src/ops/live-api.ts), as the client exports them. */
export * from '../ops/live-api.ts';
